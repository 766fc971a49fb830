"""The cost model (ARCHITECTURE §7): where a speculative-decoding system leaks speed.

Speedup over AR = τ(N) / c(N); the ceiling is the speedup times three factors (a better tree,
kernels at their byte floors, no time outside the kernels). Pieces: device peaks (`devices`,
`cpu_probe`), analytic bytes/FLOPs and byte floors per kernel class (`analytic`), the system's
step profile (`profile`), recordings and exact replay of τ (`recording`, `replay`), the
decomposition (`decompose`), and running a system's own profiler/recorder on a slot (`runner`).
"""

from .analytic import CLASSES, DrafterShape, StepShape, Work, floors, step_work
from .decompose import FACTORS, ClassCost, CostReport, decompose
from .devices import GPU_SPECS, DeviceSpec, device_spec
from .measure import measure
from .profile import StepProfile, load_profile
from .recording import Record, label_sets, load_records
from .replay import BUDGETS, TREE_POLICIES, Replay, ReplayTable, oracle_accept, replay, replay_table
from .runner import cached_record, run_profile, run_record, tree_digest

__all__ = [
    "BUDGETS",
    "CLASSES",
    "FACTORS",
    "GPU_SPECS",
    "TREE_POLICIES",
    "ClassCost",
    "CostReport",
    "DeviceSpec",
    "DrafterShape",
    "Record",
    "Replay",
    "ReplayTable",
    "StepProfile",
    "StepShape",
    "Work",
    "cached_record",
    "decompose",
    "device_spec",
    "floors",
    "label_sets",
    "load_profile",
    "load_records",
    "measure",
    "oracle_accept",
    "replay",
    "replay_table",
    "run_profile",
    "run_record",
    "step_work",
    "tree_digest",
]
