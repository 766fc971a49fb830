"""The `claude` agent backend (ARCHITECTURE §9): master and sub-agents through claude-agent-sdk.

Public API: `ClaudeOptions` (model and budgets) and `load_options`, `ClaudeMaster`, `ClaudeSubAgent`,
`api_key()`, `key_configured()`, `sdk_missing()`, `sandbox_missing()`.
The SDK is an optional install (`specpilot[claude]`); nothing here imports it until a run starts.
"""

from .config import ClaudeOptions, api_key, key_configured, load_options, sandbox_missing, sdk_missing
from .master import ClaudeMaster
from .subagent import ClaudeSubAgent

__all__ = ["ClaudeMaster", "ClaudeOptions", "ClaudeSubAgent", "api_key", "key_configured", "load_options",
           "sandbox_missing", "sdk_missing"]  # fmt: skip
