"""The controller: the judge of every patch (ARCHITECTURE §4-6).

Agents may call it but never change it; it guards its own source digest. Public API below; the
rest of the package is private.
"""

from .audit import audit_system
from .context import judge_digest, protected_paths
from .engine import Request, SystemFailed
from .evaluate import Evaluation, compare, cost_report, measure_noise, quick_compare
from .integrity import controller_digest
from .phase0 import run_phase0
from .systems import CandidateRefused, protected_hits

__all__ = [
    "CandidateRefused",
    "Evaluation",
    "Request",
    "SystemFailed",
    "audit_system",
    "compare",
    "controller_digest",
    "judge_digest",
    "cost_report",
    "measure_noise",
    "protected_hits",
    "protected_paths",
    "quick_compare",
    "run_phase0",
]
