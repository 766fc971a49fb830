"""specpilot.orchestrator: the top layer — the round loop and the `specpilot` command.

round      the loop: phase 0 → cost model → plan → implement → evaluate → combine → seal → report
sealing    approved patches merged, judged together and sealed as stock + entries
reports    the approval reports in the terminal; plots: the round's pictures
cli*       the commands (entry point `specpilot` = `main`)
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cli import main
    from .round import Round, start_or_resume

__all__ = ["Round", "main", "start_or_resume"]


def __getattr__(name: str) -> Any:
    """The round (and with it the controller, torch and scipy) loads on first use, so commands
    that do not judge (`memory list`, `deployments show`, `--help`) start in a fraction of a second."""
    if name == "main":
        from .cli import main

        return main
    if name in ("Round", "start_or_resume"):
        from . import round as _round

        return getattr(_round, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
