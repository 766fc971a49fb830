"""Held-out prompts: the operator's own, judged in place of the public sets.

The public sets (HumanEval, MT-Bench, ...) can be answered ahead of time by anyone, so a candidate
may ship their answers. Secret tags (controller/context.py) stop shipped answers from being
replayed as outputs, but not from being used as drafts the target verifies: the outputs stay
exact and the gain is real on those prompts and on no others (docs/BENCHMARKS.md, "Public answers
as drafts"). Only prompts nobody outside the controller has seen close that: a sample of the
deployment's real traffic, say. `specpilot workloads held-out add` stores them in the controller's
records (controller/held_out.py: the database, which no agent may read and no judged system
sees); every draw of the deployment (Phase 0, comparisons, audits) then takes its measured and
warm-up requests from them, as many per set as the workload samples, and the verdict's evidence
says so (`draw.held_out`).

A line: `{"set": "<a set of workload.sets>", "turns": ["<user message>", ...]}` (or `"prompt"` for
one message), optional `"id"`; rendered like a public prompt of that set (its first turn, the
target's chat template, a secret tag).
"""

from __future__ import annotations

from ..errors import SpecPilotError
from ..spec import Deployment
from .sources import Prompt, _generic, _read_jsonl

PREFIX = "held"  # held-out prompt ids: held-<set>-<id>, never a public prompt's


def parse(dep: Deployment, text: str, where: str) -> list[Prompt]:
    """The prompts of a held-out JSONL file, checked (`from_rows`)."""
    return from_rows(dep, _read_jsonl(text, where), where)


def from_rows(
    dep: Deployment, rows: list[dict], where: str | None = None, prefix: str = PREFIX
) -> list[Prompt]:
    """Held-out prompts from their rows (a file's lines, or as stored: `to_rows`), checked: every
    row names a set of the deployment's workload and has non-empty turns; ids (`<prefix>-<set>-<id>`)
    are unique. (The controller's composed prompts, controller/composed.py, are stored alike.)"""
    where = where or f"deployment {dep.name!r}'s held-out prompts"
    prompts: list[Prompt] = []
    for n, row in enumerate(rows, 1):
        name = row.get("set")
        if name not in dep.workload.sets:
            raise SpecPilotError(
                f"{where}: line {n} has set {name!r}; each line needs `set`, one of "
                f"{', '.join(dep.workload.sets)} (deployment {dep.name!r}'s workload.sets)"
            )
        try:
            fields = _generic({k: v for k, v in row.items() if k != "set"})
            turns = fields["turns"]
            if (
                not isinstance(turns, list)
                or not turns
                or not all(isinstance(t, str) and t.strip() for t in turns)
            ):
                raise ValueError("turns must be non-empty strings")
            native = fields.pop("id")
            prompts.append(Prompt(set=name, index=n - 1, id=f"{prefix}-{name}-{native if native is not None else n}",
                                  **fields))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise SpecPilotError(
                f"{where}: line {n} is malformed ({e!r}); each line needs `set` and `turns` (a list of "
                f"user messages) or `prompt` (one message), optional `id`"
            ) from None
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise SpecPilotError(f"{where}: prompt ids are not unique per set; give every line a distinct `id`")
    if not prompts:
        raise SpecPilotError(f"{where}: no prompts; one JSON object per line")
    return prompts


def counts(prompts: list[Prompt]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in prompts:
        out[p.set] = out.get(p.set, 0) + 1
    return out


def to_rows(prompts: list[Prompt], prefix: str = PREFIX) -> list[dict]:
    """The prompts as stored: what `from_rows` (with the same `prefix`) reads back."""
    return [{"set": p.set, "id": p.id[len(f"{prefix}-{p.set}-") :], "turns": p.turns} for p in prompts]
