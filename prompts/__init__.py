"""specpilot.prompts: the agents' prompt templates (package data, rendered by agents/claude/prompting.py).

No code: `master.md.j2` and `subagent.md.j2` are read with importlib.resources.
"""

__all__: list[str] = []
