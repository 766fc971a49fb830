"""specpilot.orchestrator: the top layer — the round loop and the `specpilot` command.

round      the loop: phase 0 → cost model → plan → implement → evaluate → combine → seal → report
sealing    approved patches merged, judged together and sealed as stock + entries
reports    the approval reports in the terminal; plots: the round's pictures
cli*       the commands (entry point `specpilot` = `main`)
"""

from .cli import main
from .round import Round, start_or_resume

__all__ = ["Round", "main", "start_or_resume"]
