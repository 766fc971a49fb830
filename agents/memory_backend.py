"""The offline `memory` agent: deterministic directions from the memory, no key, no network.

The master proposes (a) applying a memory entry of this engine that the system lacks (its
requirements come with it) and (b) retuning a knob of a variant registry to a tested value the
system does not hold. It ranks them by the cost-model factor each attacks (largest first), then by
the approved gain recorded for this deployment in the entry's evidence, then entries before retunes and
small knob steps before large ones, and never repeats a direction already judged against the
same system. The sub-agent applies the entry's deltas with `git apply`
or edits the one knob line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from specpilot.deployments import set_knob
from specpilot.memory_store import git_bytes, git_try

from .protocol import AgentError, ControllerTools, Direction, KnobChange, Patch, PlanningContext


def _recorded_gain(
    entry: dict[str, Any], deployment: str, knob: str | None = None, value: Any = None
) -> float:
    """The best gain this deployment recorded for the entry (or one knob value of it); 0 if none.

    A measurement the controller rejected is noise by its own standard and ranks nothing."""
    gains = [
        float(ev["gain"]) - 1.0
        for ev in entry.get("evidence", [])
        if ev.get("deployment") == deployment
        and "gain" in ev
        and ev.get("approved") is not False
        and (knob is None or (ev.get("knob") == knob and ev.get("value") == value))
    ]
    return max(gains, default=0.0)


def _step(current: Any, value: Any) -> float:
    """How far a retune moves a knob: small numeric steps first, switches of kind last."""
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) and x > 0 for x in (current, value))
    return abs(math.log(value / current)) if numeric else math.inf


def candidate_directions(ctx: PlanningContext) -> list[Direction]:
    """Every direction the memory offers for this system, best first."""
    factors = ctx.costmodel.get("factors", {})
    have = set(ctx.system_entries)
    out: list[tuple[tuple, Direction]] = []
    for e in ctx.memory:
        if not e.get("applicable", True):
            continue
        factor = e.get("target_factor", "none")
        weight = float(factors.get(factor, 1.0))
        if e["name"] not in have and e.get("has_code", True):
            gain = _recorded_gain(e, ctx.deployment)
            d = Direction(
                title=f"apply memory entry {e['name']}",
                hypothesis=e.get("summary") or f"entry {e['name']} attacks the {factor} factor",
                target_factor=factor, expected_gain=max(gain, 0.0),
                plan=f"apply {e['name']} with its requirements ({', '.join(e.get('requires', [])) or 'none'})",
                entry=e["name"],
            )  # fmt: skip
            out.append(((-weight, -gain, 0, 0.0, d.key), d))
        if e["name"] in have or not e.get("has_code", True):
            for v in e.get("variants", []):
                current = ctx.knobs.get(f"{v['file']}:{v['knob']}")
                for value in v["values"]:
                    if value == current:
                        continue
                    gain = _recorded_gain(e, ctx.deployment, v["knob"], value)
                    d = Direction(
                        title=f"retune {v['knob']} = {value!r} (now {current!r})",
                        hypothesis=f"{v['knob']} is a tested knob of {e['name']}; {value!r} may suit this deployment",
                        target_factor=factor, expected_gain=max(gain, 0.0),
                        plan=f"set {v['knob']} = {value!r} in {v['file']}",
                        knob=KnobChange(knob=v["knob"], file=v["file"], value=value),
                    )  # fmt: skip
                    out.append(((-weight, -gain, 1, _step(current, value), d.key), d))
    return [d for _, d in sorted(out, key=lambda t: t[0])]


class MemoryMaster:
    """Plans one direction per free slot from the memory; deterministic."""

    def plan(self, ctx: PlanningContext) -> list[Direction]:
        judged = {p["key"] for p in ctx.past if p.get("baseline_tree") == ctx.system_tree}
        chosen: list[Direction] = []
        knobs_taken: set[str] = set()
        for d in candidate_directions(ctx):
            if d.key in judged:
                continue
            if d.knob is not None:  # one value per knob per round: spread the slots over knobs
                if d.knob.knob in knobs_taken:
                    continue
                knobs_taken.add(d.knob.knob)
            chosen.append(d)
            if len(chosen) == len(ctx.slots):
                break
        return chosen


def _apply_delta(worktree: Path, name: str, delta: str) -> None:
    """Apply an entry's delta (made on stock) with a three-way merge onto this system's files.

    Hunks that touch other lines than the system's own changes merge cleanly; overlapping ones
    (two entries adding a knob at the same place) are a conflict, named file by file.
    """
    proc = git_try(worktree, "apply", "--3way", "--whitespace=nowarn", "-", input=delta.encode())
    if proc.returncode == 0:
        return
    err = proc.stderr.decode(errors="replace")
    for args in (["reset", "-q", "--hard"], ["clean", "-fdq"]):  # no conflict markers left behind
        git_try(worktree, *args)
    files = re.findall(r"Applied patch to '([^']+)' with conflicts", err) or re.findall(
        r"patch failed: ([^:]+):", err
    )
    where = ", ".join(dict.fromkeys(files)) or err.strip().splitlines()[-1]
    raise AgentError(
        f"entry {name} does not apply to this system: its delta (made on stock) conflicts with the "
        f"system's code in {where}; combine them by hand or store an entry built on this system"
    )


class MemorySubAgent:
    """Applies an entry's deltas (requirements first) or one knob change in the worktree."""

    def __init__(self, deltas: dict[str, list[tuple[str, str]]]):
        # entry name -> [(entry, delta)] in application order, excluding what the system holds
        self.deltas = deltas

    def implement(self, direction: Direction, worktree: Path, slot: str, tools: ControllerTools) -> Patch:
        if direction.entry:
            for name, delta in self.deltas.get(direction.entry, []):
                if delta:
                    _apply_delta(worktree, name, delta)
            summary = f"applied {', '.join(n for n, _ in self.deltas.get(direction.entry, []))}"
        elif direction.knob:
            set_knob(worktree / direction.knob.file, direction.knob.knob, direction.knob.value)
            summary = f"set {direction.knob.knob} = {direction.knob.value!r} in {direction.knob.file}"
        else:
            raise AgentError(f"direction {direction.title!r} names neither an entry nor a knob")
        git_bytes(worktree, "add", "-A")
        diff = git_bytes(worktree, "diff", "--cached").decode()
        return Patch(direction=direction, worktree=worktree, diff=diff, summary=summary)
