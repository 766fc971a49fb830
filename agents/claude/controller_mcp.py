"""The controller functions a sub-agent may call, as in-process MCP tools (never files it could edit).

Each tool takes no arguments: it is bound to the agent's worktree and measures what is in it now,
through the `ControllerTools` the round passes in. None of them approves anything; every answer
says so. A controller error (no Phase 0 yet, a system that crashed) goes back to the agent as an
error result it can read, not as a crash of the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..protocol import ControllerTools

NOT_A_VERDICT = "not a verdict: only the round's paired judgement approves a patch"

DESCRIPTIONS = {
    "quick_measure": "Quick paired measurement of your worktree against the current system: one block of "
    "paired, slot-swapped runs on a few requests. Returns the gain, its lower bound and whether the output "
    "tokens changed. Takes minutes. Not a verdict.",
    "quick_audit": "Token-forcing audit of your worktree's output against the stock scorer: mismatch rate "
    "and large-margin events compared with stock's. Takes minutes. Not a verdict.",
    "profile": "Cost-model report of your worktree's system: tokens per step τ, relative step cost c, "
    "time per kernel class and the three ceiling factors (tree, kernel, outside). Takes minutes.",
}


def _result(data: Any, error: bool = False) -> dict[str, Any]:
    text = data if isinstance(data, str) else json.dumps(data, default=str, indent=1)
    return {"content": [{"type": "text", "text": text}], **({"is_error": True} if error else {})}


def controller_server_tools(tools: ControllerTools, worktree: Path) -> list[Any]:
    """The SdkMcpTool list of the `controller` MCP server for one sub-agent."""
    import anyio
    from claude_agent_sdk import ToolAnnotations, tool

    def make(name: str, fn: Callable[[Path], dict[str, Any]]):
        @tool(
            name,
            DESCRIPTIONS[name],
            {},
            annotations=ToolAnnotations(readOnlyHint=True, maxResultSizeChars=200_000),
        )
        async def handler(_args: dict[str, Any]) -> dict[str, Any]:
            try:
                # The controller blocks for minutes: run it off the event loop that serves the CLI.
                data = await anyio.to_thread.run_sync(fn, worktree)
            except Exception as e:  # the agent reads the error; the run goes on
                return _result(f"{name} failed: {type(e).__name__}: {e}", error=True)
            return _result({**data, "note": NOT_A_VERDICT})

        return handler

    return [make("quick_measure", tools.quick_measure), make("quick_audit", tools.quick_audit),
            make("profile", tools.profile)]  # fmt: skip
