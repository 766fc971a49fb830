"""The master agent: one SDK run over the planning context, answering with directions as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specpilot.deployments import Deployment

from ..protocol import AgentError, Direction, PlanningContext
from . import session
from .config import ClaudeOptions
from .prompting import render

SYSTEM = "You are SpecPilot's planning agent. You read code and reports; you never change files."


def directions_schema(slots: int) -> dict[str, Any]:
    """The structured-output schema: {"directions": [Direction, ...]} with at most one per slot."""
    item = Direction.model_json_schema()
    defs = item.pop("$defs", {})
    schema: dict[str, Any] = {
        "type": "object", "additionalProperties": False, "required": ["directions"],
        "properties": {"directions": {"type": "array", "items": item, "maxItems": slots}},
    }  # fmt: skip
    if defs:
        schema["$defs"] = defs  # refs in `item` point at #/$defs/...
    return schema


def _where(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(the direction)"


def parse_directions(data: Any, slots: int, refusals: list[str], record: dict[str, Any]) -> list[Direction]:
    """Validated directions, or one AgentError naming what is wrong with which direction."""
    if data is None:
        why = f"; the last answer was refused: {refusals[-1]}" if refusals else ""
        raise AgentError(f"the master returned no directions{why}", record)
    items = data.get("directions") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise AgentError(f"the master's answer has no list `directions`: {str(data)[:200]}", record)
    if len(items) > slots:
        raise AgentError(f"the master planned {len(items)} directions for {slots} slots", record)
    out: list[Direction] = []
    for i, raw in enumerate(items):
        try:
            out.append(Direction.model_validate(raw))
        except ValidationError as e:
            problems = "; ".join(f"{_where(err)}: {err['msg']}" for err in e.errors())
            raise AgentError(f"the master's direction {i} is malformed: {problems}", record) from None
    keys = [d.key for d in out]
    for i, k in enumerate(keys):
        if k in keys[:i]:
            raise AgentError(f"the master's directions {keys.index(k)} and {i} are the same ({k})", record)
    return out


class ClaudeMaster:
    """Plans directions with one Claude run; read-only tools over the current system's tree."""

    def __init__(self, dep: Deployment, options: ClaudeOptions, cwd: Path, transcript: Path, protected: list[str],
                 hidden: Sequence[Path] = ()):  # fmt: skip
        self.dep, self.options, self.cwd, self.transcript, self.protected = (
            dep,
            options,
            cwd,
            transcript,
            protected,
        )
        self.hidden = list(hidden)  # what its run may not read: the controller's records (Home.records)
        self.record: dict[str, Any] = {}  # the last run's transcript, cost and usage

    def plan(self, ctx: PlanningContext) -> list[Direction]:
        prompt = render("master.md.j2", dep=self.dep, ctx=ctx, protected=self.protected,
                        budget={**ctx.budget, "per_agent_run": self.options.model_dump()})  # fmt: skip
        spec = session.RunSpec(prompt=prompt, cwd=self.cwd, tools=["Read", "Glob", "Grep"],
                               transcript=self.transcript, options=self.options, system_prompt=SYSTEM,
                               output_schema=directions_schema(len(ctx.slots)), hidden=self.hidden)  # fmt: skip
        try:
            run = session.run(spec)
        except AgentError as e:
            self.record = e.record
            raise
        self.record = run.record()
        return parse_directions(run.structured, len(ctx.slots), run.tool_errors.get("StructuredOutput", []),
                                self.record)  # fmt: skip
