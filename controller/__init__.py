"""The controller: the judge of every patch (ARCHITECTURE §4-6).

Agents may call it but never change it; it guards its own source digest. Public API below; the
rest of the package is private.
"""

from . import held_out
from .audit import audit_system
from .context import judge_digest, protected_paths
from .engine import Request, SystemFailed
from .evaluate import Evaluation, compare, cost_report, measure_noise, quick_compare
from .integrity import controller_digest
from .phase0 import run_phase0
from .refspec_system import tool_jail
from .slots import Slot, lease
from .systems import CandidateRefused, checkout, protected_hits

__all__ = [
    "CandidateRefused",
    "Evaluation",
    "Request",
    "Slot",
    "SystemFailed",
    "audit_system",
    "checkout",
    "compare",
    "controller_digest",
    "cost_report",
    "held_out",
    "judge_digest",
    "lease",
    "measure_noise",
    "protected_hits",
    "protected_paths",
    "quick_compare",
    "run_phase0",
    "tool_jail",
]
