"""The carryover check (controller/checks.py) on comparisons' raw records: each system's slowdown
right after the other's turn, and whether the check names the candidate.

    python bench/carryover_replay.py RAW.jsonl|RAW.tgz ... [--plant 0.03] [--json OUT]

A raw record is the `<home>/runs/<run id>.jsonl` a paired run writes (bench/gpu_round.py keeps
them as `aa-N.jsonl`, `gain3-N.jsonl`). Only interleaved runs (one slot, turns in ABBA order) are
read; on honest pairs (A/A, a slowed stock against stock) a finding is a false one. `--plant D`
stretches every baseline turn that follows a candidate's turn by D (its time × (1 + D)), as work
queued behind the candidate's answers would: the check's power on the device's own noise.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import tarfile
from pathlib import Path

from specpilot.controller.checks import after_other, carryover
from specpilot.controller.engine import RequestResult
from specpilot.controller.paired import PairedRun
from specpilot.controller.period import PeriodResult


def runs_in(path: Path) -> dict[str, list[dict]]:
    """name -> the records of each raw .jsonl (in a .tgz: each member)."""
    if path.suffix == ".jsonl":
        return {path.name: [json.loads(x) for x in path.read_text().splitlines()]}
    out = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".jsonl"):
                text = io.TextIOWrapper(tar.extractfile(m), encoding="utf-8").read()
                out[f"{path.name}:{Path(m.name).name}"] = [json.loads(x) for x in text.splitlines()]
    return out


def paired_run(rows: list[dict], plant: float = 0.0) -> PairedRun | None:
    """The run's periods (one per block) rebuilt from its request lines, each A turn right after a
    B turn `plant` longer; None unless interleaved."""
    reqs = [r for r in rows if "system" in r]
    if not reqs or len({r["slot"] for r in reqs}) != 1 or any(r.get("period", 0) for r in reqs):
        return None  # two slots or two periods a block: not the interleaved design
    run = PairedRun(design="interleaved", warmup_ids={r["id"] for r in reqs if r["warmup"]})
    for b in sorted({r["block"] for r in reqs}):
        results: dict[str, dict[str, RequestResult]] = {"A": {}, "B": {}}
        prev = None
        for r in sorted((r for r in reqs if r["block"] == b), key=lambda r: r["t_send"]):
            stretch = 1 + plant if (r["system"], prev) == ("A", "B") else 1.0
            done = r["t_send"] + (r["t_done"] - r["t_send"]) * stretch
            results[r["system"]][r["id"]] = RequestResult(r["id"], r["t_send"], done, tokens=r["tokens"])
            prev = r["system"]
        run.periods.append(PeriodResult(results, {}, {}))
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path, nargs="+")
    ap.add_argument("--plant", type=float, default=0.0, help="stretch A's turns after B's by this share")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for path in args.raw:
        for name, records in runs_in(path).items():
            run = paired_run(records, args.plant)
            if run is None:
                continue
            fits = {lb: after_other(run, lb) for lb in ("A", "B")}
            row = {"run": name, "blocks": len(run.periods), "finding": carryover(run)}
            for lb, fit in fits.items():
                if fit is not None:
                    row |= {f"{lb}_after_other": math.expm1(fit[0]), f"{lb}_se": fit[1], f"{lb}_dof": fit[2]}
            rows.append(row)
            a, b = row.get("A_after_other"), row.get("B_after_other")
            print(f"{name:48s} blocks {row['blocks']:2d}  A after B {a if a is None else f'{a:+.2%}'}"
                  f"  B after A {b if b is None else f'{b:+.2%}'}  {'FINDING' if row['finding'] else '-'}")  # fmt: skip
    told = [r for r in rows if "A_dof" in r and "B_dof" in r]
    print(f"{len(rows)} interleaved runs, {len(told)} with both orders in their blocks; plant {args.plant:.1%}: "
          f"{sum(bool(r['finding']) for r in rows)} findings")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"plant": args.plant, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
