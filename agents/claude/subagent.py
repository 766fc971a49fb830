"""The sub-agent: one confined Claude run in a worktree per direction and device slot."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment

from ..memory_backend import MemorySubAgent
from ..protocol import AgentError, ControllerTools, Direction, Patch
from . import diffcheck, session
from .config import ClaudeOptions
from .controller_mcp import controller_server_tools
from .prompting import render

TOOLS = ["Read", "Edit", "Write", "Glob", "Grep", "Bash"]
SYSTEM = ("You are a SpecPilot sub-agent: an expert in speculative decoding and GPU/CPU inference "
          "performance. You change only the files of your worktree.")  # fmt: skip


class ClaudeSubAgent:
    """Implements a free-form direction with Claude; an `entry` or `knob` direction (planned from the
    memory) is applied exactly by the memory backend instead, at no cost."""

    def __init__(self, dep: Deployment, options: ClaudeOptions, transcript_for: Callable[[Path], Path],
                 protected: list[str], costmodel: dict[str, Any] | None = None,
                 exact: MemorySubAgent | None = None, hidden: Sequence[Path] = ()):  # fmt: skip
        self.dep, self.options, self.transcript_for = dep, options, transcript_for
        self.protected, self.costmodel, self.exact = protected, costmodel or {}, exact
        self.hidden = list(hidden)  # what its runs may not read: the controller's records (Home.records)

    def implement(self, direction: Direction, worktree: Path, slot: str, tools: ControllerTools) -> Patch:
        if direction.entry or direction.knob:
            if self.exact is None:
                raise AgentError(
                    f"direction {direction.title!r} names a memory entry or knob, but no memory is loaded"
                )
            patch = self.exact.implement(direction, worktree, slot, tools)
            diffcheck.check(worktree, patch.diff, self.protected, self.options.max_diff_bytes)
            return patch
        dotgit = (worktree / ".git").read_bytes()
        prompt = render("subagent.md.j2", dep=self.dep, direction=direction, slot=slot, costmodel=self.costmodel,
                        protected=self.protected, options=self.options,
                        max_diff_bytes=self.options.max_diff_bytes)  # fmt: skip
        spec = session.RunSpec(prompt=prompt, cwd=worktree, tools=TOOLS, transcript=self.transcript_for(worktree),
                               options=self.options, write_root=worktree, system_prompt=SYSTEM,
                               mcp_tools=controller_server_tools(tools, worktree), slot=slot,
                               hidden=self.hidden)  # fmt: skip
        run = session.run(spec)
        record = run.record()
        if (worktree / ".git").read_bytes() != dotgit:  # it names the repository the diff is read from
            raise AgentError(
                "the worktree's .git pointer changed during the run; its diff cannot be trusted", record
            )
        diff = diffcheck.collect(worktree)
        diffcheck.check(worktree, diff, self.protected, self.options.max_diff_bytes, record)
        summary = (run.result or "").strip() or direction.title
        return Patch(direction=direction, worktree=worktree, diff=diff, summary=summary[:2000],
                     transcript=run.transcript, cost_usd=run.cost_usd, usage=run.usage)  # fmt: skip
