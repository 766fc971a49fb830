"""Recordings for exact replay of τ (CONTRACTS §4): greedy tokens and one lattice per prefix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import SpecPilotError
from specpilot.kernels import Lattice

REQUIRED = ("id", "prompt_len", "block_size", "top_k", "drafter", "greedy", "lattices")


@dataclass
class Record:
    """One request: the target's AR greedy tokens and lattices[i] for prefix prompt + greedy[:i]."""

    id: str
    prompt_len: int
    block_size: int
    top_k: int
    drafter: str
    greedy: list[int]
    lattices: list[Lattice]
    set_name: str | None = None  # from the request file, when the caller knows it

    @property
    def set(self) -> str:
        """The benchmark set: from the request file, else the id's prefix ('humaneval-3' -> 'humaneval')."""
        return self.set_name or self.id.split("-", 1)[0]


def request_sets(requests: Path) -> dict[str, str]:
    """Request id -> benchmark set, from a request file (CONTRACTS §6)."""
    out = {}
    for line in Path(requests).read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            if isinstance(obj, dict) and "id" in obj and "set" in obj:
                out[str(obj["id"])] = str(obj["set"])
    return out


def label_sets(records: list[Record], requests: Path | None) -> list[Record]:
    """Name each record's benchmark set from the request file it was recorded from."""
    if requests is not None:
        sets = request_sets(requests)
        for rec in records:
            rec.set_name = sets.get(rec.id, rec.set_name)
    return records


def parse_record(obj: object, where: str) -> Record:
    """One JSON line of a recording; problems name `where` (file:line)."""
    if not isinstance(obj, dict):
        raise SpecPilotError(f"{where}: a record is a JSON object (CONTRACTS §4)")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise SpecPilotError(f"{where}: record is missing {', '.join(missing)} (CONTRACTS §4)")
    greedy, lattices = obj["greedy"], obj["lattices"]
    if not isinstance(greedy, list) or not isinstance(lattices, list):
        raise SpecPilotError(f"{where}: `greedy` and `lattices` must be lists")
    if len(lattices) < len(greedy):
        raise SpecPilotError(
            f"{where}: {len(lattices)} lattices for {len(greedy)} greedy tokens; replay needs one "
            "lattice per prefix position (re-record with `python -m refspec.record`)"
        )
    try:
        lats = [Lattice.coerce(lat) for lat in lattices]
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise SpecPilotError(f"{where}: malformed lattice: {e}") from None
    return Record(
        id=str(obj["id"]),
        prompt_len=int(obj["prompt_len"]),
        block_size=int(obj["block_size"]),
        top_k=int(obj["top_k"]),
        drafter=str(obj["drafter"]),
        greedy=[int(t) for t in greedy],
        lattices=lats,
    )


def load_records(path: Path) -> list[Record]:
    """Every record of a recording file (JSON lines)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise SpecPilotError(f"{path}: no such recording; make one with `python -m refspec.record`") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecPilotError(f"{path}:{n}: not JSON ({e})") from None
        records.append(parse_record(obj, f"{path}:{n}"))
    if not records:
        raise SpecPilotError(f"{path}: the recording holds no records")
    return records
