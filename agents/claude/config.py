"""Settings of the claude backend: model and budgets (kept in the round state so --resume keeps them).

Read from `<home>/claude.toml` when it exists (any of the `ClaudeOptions` fields), then overridden
by the options of `specpilot round`. The API key is read only from the environment.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..protocol import AgentError

KEY_ENV = "ANTHROPIC_API_KEY"
CONFIG_FILE = "claude.toml"


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
    key = os.environ.get(KEY_ENV, "").strip()  # only the environment: never a file an agent could read
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


def sandbox_missing() -> str | None:
    """Why the CLI's Bash sandbox cannot run here (Linux needs bubblewrap and socat), or None."""
    if not sys.platform.startswith("linux"):
        return None  # macOS: the CLI uses the system's sandbox-exec
    missing = [p for p in ("bwrap", "socat") if shutil.which(p) is None]
    if missing:
        return (f"the Claude Code Bash sandbox needs {' and '.join(missing)}, which is not on PATH: "
                "apt-get install bubblewrap socat (agents never run unsandboxed)")  # fmt: skip
    return None


def key_configured() -> bool:
    return bool(os.environ.get(KEY_ENV, "").strip())


def load_options(home_root: Path, **overrides: Any) -> ClaudeOptions:
    """`<home>/claude.toml` (optional) with `overrides` (the CLI's options; None = not given) on top."""
    path = home_root / CONFIG_FILE
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise AgentError(f"{path} is not valid TOML: {e}") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ClaudeOptions.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise AgentError(f"bad claude agent settings ({path} or the round options): {problems}") from None
