"""Speedup = τ(N) / c(N) and the ceiling's three factors (ARCHITECTURE §7, paper §3.2).

    c(N)      = T_step(N) / T_AR
    ceiling   = speedup × F_tree × F_kernel × F_outside
    F_tree    = τ of the best tree at the same node budget (exact replay) / τ now
    F_kernel  = profiled kernel time / byte-floor time
    F_outside = step wall time / profiled kernel time

The product telescopes: ceiling = τ_best × T_AR / floor, i.e. the speedup of a system that
accepts like the best tree and runs every kernel class at its byte floor with nothing outside the
kernels. A factor below 1 means the system already beats that assumption (a format smaller than
the deployment's dtype, several drafts per exact pass): the report keeps it as measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specpilot.deployments import Deployment

from .analytic import CLASSES, DrafterShape, StepShape, Work, step_work
from .devices import DeviceSpec
from .profile import StepProfile
from .replay import ReplayTable

FACTORS = ("tree", "kernel", "outside")  # the target_factor names of memory entries


@dataclass
class ClassCost:
    """One kernel class: profiled time per step against its byte floor."""

    name: str
    time_s: float
    floor_s: float
    bytes: float
    flops: float
    bound: str  # "bytes" | "flops": which side of the floor rule binds

    @property
    def ratio(self) -> float | None:
        return self.time_s / self.floor_s if self.floor_s > 0 else None


@dataclass
class CostReport:
    """Everything the cost model says about one system on one deployment (JSON via to_dict)."""

    deployment: str
    system: str | None
    mode: str
    device: dict
    dtype: str
    rows_per_step: float
    batch: int
    context_len: float
    tau: float
    c: float
    speedup: float
    step_wall_s: float
    ar_step_wall_s: float
    profiled_s: float
    floor_s: float
    classes: list[ClassCost]
    budget: int
    tau_best: float
    best_policy: str
    f_tree: float
    f_kernel: float
    f_outside: float
    ceiling: float
    largest: str
    tau_chain_replay: float | None = None
    replay: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def factors(self) -> dict[str, float]:
        return {"tree": self.f_tree, "kernel": self.f_kernel, "outside": self.f_outside}

    def to_dict(self) -> dict:
        out = asdict(self)
        for row, cls in zip(out["classes"], self.classes, strict=True):
            row["ratio"] = cls.ratio
        out["factors"] = self.factors
        return out


def node_budget(profile: StepProfile) -> int:
    """The system's node budget: a `node_budget` the engine reports, else its block size (the
    drafts a full chain verifies)."""
    return int(profile.extra.get("node_budget") or profile.block_size)


def decompose(
    profile: StepProfile,
    dep: Deployment,
    device: DeviceSpec,
    replay: ReplayTable | None,
    *,
    budget: int | None = None,
    system: str | None = None,
) -> CostReport:
    """The report for a profiled system; `replay` gives F_tree (None: F_tree = 1, noted)."""
    notes: list[str] = []
    dtype = dep.target.dtype
    if profile.dtype != dtype:
        notes.append(f"the system ran in {profile.dtype}; floors are for the deployment's {dtype} weights")
    batch = int(profile.extra.get("batch", 1))
    shape = StepShape(rows=profile.rows_per_step, batch=batch, context=profile.context_len)
    drafter = DrafterShape(dep.drafter.kind, dep.drafter.params, dep.drafter.block_size)
    work: dict[str, Work] = step_work(dep.target.arch, dtype, drafter, shape)
    classes = []
    for name in CLASSES:
        w = work[name]
        t = profile.classes.get(name, 0.0)
        if w.bytes == 0 and w.flops == 0 and t == 0:
            continue  # a class this target does not have (no recurrent layers)
        classes.append(ClassCost(name, t, w.floor_s(device, dtype), w.bytes, w.flops, w.bound(device, dtype)))
    floor = sum(c.floor_s for c in classes)

    c = profile.step_wall_s / profile.ar_step_wall_s
    speedup = profile.tau / c
    budget = budget or node_budget(profile)
    tau_chain = None
    if replay is not None:
        if budget not in replay.budgets:
            raise ValueError(f"budget {budget} was not replayed (have {replay.budgets})")
        best_policy, tau_best = replay.best_tree(budget)
        tau_chain = replay.tau("chain", budget)
        if abs(tau_chain - profile.tau) > 0.02 * profile.tau and profile.mode == "spec":
            notes.append(
                f"replayed chain τ {tau_chain:.3f} differs from the profiled τ {profile.tau:.3f} by more "
                "than 2% (different requests, or the system does not verify the stock chain)"
            )
    else:
        best_policy, tau_best = "unmeasured", profile.tau
        notes.append("no recording: F_tree is not measured and counts as 1")

    if profile.profiled_s > profile.step_wall_s:
        notes.append(
            f"profiled kernel time {profile.profiled_s * 1e3:.1f} ms exceeds the step wall time "
            f"{profile.step_wall_s * 1e3:.1f} ms: profiler overhead (or another load during the profiled "
            "run) inflates the class times, so F_kernel is too high and F_outside < 1 is no real gain"
        )
    f_tree = tau_best / profile.tau
    f_kernel = profile.profiled_s / floor if floor > 0 else 1.0
    f_outside = profile.step_wall_s / profile.profiled_s if profile.profiled_s > 0 else 1.0
    factors = {"tree": f_tree, "kernel": f_kernel, "outside": f_outside}
    largest = max(FACTORS, key=lambda k: factors[k])
    return CostReport(
        deployment=dep.name,
        system=system,
        mode=profile.mode,
        device=device.to_dict(),
        dtype=dtype,
        rows_per_step=profile.rows_per_step,
        batch=batch,
        context_len=profile.context_len,
        tau=profile.tau,
        c=c,
        speedup=speedup,
        step_wall_s=profile.step_wall_s,
        ar_step_wall_s=profile.ar_step_wall_s,
        profiled_s=profile.profiled_s,
        floor_s=floor,
        classes=classes,
        budget=budget,
        tau_best=tau_best,
        best_policy=best_policy,
        f_tree=f_tree,
        f_kernel=f_kernel,
        f_outside=f_outside,
        ceiling=speedup * f_tree * f_kernel * f_outside,
        largest=largest,
        tau_chain_replay=tau_chain,
        replay=replay.to_dict() if replay is not None else None,
        notes=notes,
    )
