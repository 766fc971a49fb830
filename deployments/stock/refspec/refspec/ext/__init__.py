"""Extension points: mechanisms plug into stock here without editing stock's lines.

A mechanism is a module `refspec/ext/<name>.py` defining `MECHANISM = Mechanism(...)`; its knobs
are the section [<name>] of `knobs/<name>.toml` (read by config.py), checked against its knob
class here. Stock ships no mechanism. A mechanism acts only while its `enabled` knob is true, and
may provide any of:

- `policy(engine, knobs) -> Policy`: the verification policy (which rows a pass verifies and what
  it accepts), replacing stock's top-1 chain; at most one enabled mechanism may provide one;
- `draft(lattice, knobs) -> Lattice`: a filter of the drafter's lattice before the policy sees it
  (filters run in mechanism-name order);
- `head(engine, knobs) -> Head`: the argmax over the final-norm hidden states of a pass's rows,
  replacing the LM head's; at most one enabled mechanism may provide one;
- `batch(engine, knobs) -> BatchPolicy`: in batch serving (batch.py), the passes of all of a
  step's busy requests at once, each then accepted by the policy; at most one enabled mechanism
  may provide one;
- `setup(engine, knobs)`: called once after the engine is built (e.g. to convert weights).

A module here may import torch at import time: `load` runs after the process is pinned.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..config import KNOBS_DIR, Config, set_knobs
from ..errors import RefspecError


@dataclass
class Pass:
    """The rows of one verification pass. Row 0 is the last committed token (its K/V not yet cached).

    Row r sits at cache slot start + r and RoPE position start + depth[r]; mask[r][c] says whether
    row r attends row c (None: a chain, each row attends itself and the rows before it). Every row
    attends all committed slots below start.
    """

    tokens: list[int]
    depth: list[int]
    mask: list[list[bool]] | None = None
    state: Any = None  # whatever the policy needs again in accept


class Policy(Protocol):
    max_rows: int  # the most rows a pass of this policy has (CUDA graphs are captured up to it)

    def propose(self, engine: Any, lattice: Any, remaining: int) -> Pass: ...

    def accept(self, engine: Any, p: Pass, target: list[int]) -> tuple[list[int], list[int]]:
        """(committed tokens, accepted rows): `target[r]` is the target's argmax after row r; the
        accepted rows (after row 0, in path order) keep their K/V, the last committed token is the
        bonus token."""
        ...


class BatchPolicy(Protocol):
    def propose(self, lanes: list[Any], lattices: list[Any], remaining: list[int]) -> list[Pass]:
        """The pass of each busy lane (in order): `lattices[i]` is lane i's draft after the filters,
        `remaining[i]` the tokens its request still wants."""
        ...


class Head(Protocol):
    def argmax(self, hidden: Any) -> list[int]:
        """The argmax of each row's logits, from its final-norm hidden state [rows, hidden]."""
        ...


@dataclass(frozen=True)
class Mechanism:
    name: str
    knobs: type  # a dataclass whose fields (with `enabled`) are the knobs of [<name>]
    choices: dict[str, tuple] = field(default_factory=dict)
    minimum: dict[str, float] = field(default_factory=dict)
    check: Callable[[Any], str | None] | None = None  # extra validation: an error text or None
    policy: Callable[[Any, Any], Policy] | None = None
    draft: Callable[[Any, Any], Any] | None = None
    head: Callable[[Any, Any], Head] | None = None
    batch: Callable[[Any, Any], BatchPolicy] | None = None
    setup: Callable[[Any, Any], None] | None = None


def load(config: Config, knobs_dir: Path = KNOBS_DIR) -> list[tuple[Mechanism, Any]]:
    """The enabled mechanisms with their checked knobs (config.ext holds the checked knobs after)."""
    found = []
    for name, raw in sorted(config.ext.items()):
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ImportError as e:
            raise RefspecError(
                f"refspec/ext/{name}.py does not import ({e}); fix or remove the mechanism"
            ) from None
        mech = getattr(module, "MECHANISM", None)
        if not isinstance(mech, Mechanism) or mech.name != name:
            raise RefspecError(f"refspec/ext/{name}.py must define MECHANISM = Mechanism(name={name!r}, ...)")
        knobs = mech.knobs()
        path = knobs_dir / f"{name}.toml"
        set_knobs(
            path, name, knobs, dict(raw if isinstance(raw, dict) else vars(raw)), mech.choices, mech.minimum
        )
        problem = mech.check(knobs) if mech.check else None
        if problem:
            raise RefspecError(f"{path}: {problem}")
        config.ext[name] = knobs
        if getattr(knobs, "enabled", False):
            found.append((mech, knobs))
    for hook in ("policy", "head", "batch"):
        owners = [m.name for m, _ in found if getattr(m, hook)]
        if len(owners) > 1:
            raise RefspecError(
                f"mechanisms {', '.join(owners)} each replace the {hook}; enable only one of them "
                f"(set enabled = false in knobs/<name>.toml)"
            )
    return found
