"""Settings of the claude backend: model and budgets (kept in the round state so --resume keeps them)."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from ..protocol import AgentError

KEY_ENV = "ANTHROPIC_API_KEY"


class ClaudeOptions(BaseModel):
    """What a user chooses for a round with `--agent claude`; the same limits apply to every agent run
    (the master's and each sub-agent's)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None  # None: the Claude Code CLI's default model
    max_turns: int = Field(default=200, ge=1)  # model turns per agent run
    budget_usd: float = Field(default=10.0, gt=0)  # dollars per agent run, checked against the SDK's cost
    timeout_s: float = Field(default=4 * 3600, gt=0)  # wall clock per agent run
    max_diff_bytes: int = Field(default=2_000_000, ge=1)  # the largest patch a sub-agent may hand back


def api_key() -> str:
    """The Anthropic API key of this process, or one clear error naming the fix."""
    key = os.environ.get(KEY_ENV, "").strip()
    if not key:
        raise AgentError(f"the claude agent needs an API key: set {KEY_ENV} (or run with --agent memory)")
    return key


def sdk_missing() -> str | None:
    """Why claude-agent-sdk cannot be used here, or None when it can."""
    try:
        import claude_agent_sdk  # noqa: F401
    except ImportError:
        return (
            "claude-agent-sdk is not installed: pip install 'specpilot[claude]' (or run with --agent memory)"
        )
    return None
