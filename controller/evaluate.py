"""The controller's judgements: stock noise (A/A) and candidate-vs-baseline comparisons.

Every judgement checks the controller's own digest first, takes the deployment's two slots under
a lease, runs from clean exports of the workspace repository (never an agent's worktree), writes
its raw timestamps to `<home>/runs/<run id>.jsonl`, and stores the run and the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.workloads import load_requests, request_file
from specpilot.memory_store import connect, records

from .engine import Request, SystemFailed, adapter_for
from .forcing import AuditResult, audit
from .integrity import check_digest
from .paired import PairedRun, paired_run
from .slots import Slot, lease
from .stats import decide, noise_sigma, noisier_than_stock, paired_stats, within_request_spread
from .systems import ENGINE_PROTECTED, CandidateRefused, SystemTree, apply_candidate, checkout

Progress = Callable[[str], None]

# A comparison whose within-request spread exceeds stock's A/A spread at this p-value gets no verdict.
NOISE_P = 0.01


@dataclass
class Evaluation:
    """A stored verdict, as the round loop and reports use it."""

    verdict_id: str
    run_id: str | None
    deployment: str
    baseline_tree: str
    candidate_tree: str
    approved: bool
    changes_output: bool
    gain: float
    lower_bound: float
    sigma: float
    threshold: float
    unit: str
    reasons: list[str]
    evidence: dict[str, Any] = field(default_factory=dict)


def workspace_repo(home: Home, dep: Deployment) -> Path:
    repo = home.workspaces / dep.name / "repo"
    if not (repo / ".git").is_dir():
        raise SpecPilotError(
            f"no workspace for {dep.name!r} under {home.workspaces}; run `specpilot workspace init --deployment {dep.name}`"
        )
    return repo


def systems_cache(home: Home, dep: Deployment) -> Path:
    return home.workspaces / dep.name / "systems"


def slots_of(dep: Deployment) -> tuple[Slot, Slot]:
    if len(dep.devices.slots) < 2:
        raise SpecPilotError(f"deployment {dep.name!r}: a paired run needs two slots in devices.slots")
    s0, s1 = (Slot.parse(s) for s in dep.devices.slots[:2])
    s0.check_exists()
    s1.check_exists()
    return s0, s1


def requests_of(dep: Deployment, home: Home, limit: int | None = None) -> list[Request]:
    reqs = [Request(r.id, r.input_ids, r.max_new_tokens) for r in load_requests(request_file(dep, home))]
    return reqs[:limit] if limit else reqs


def protected_paths(dep: Deployment) -> list[str]:
    return ENGINE_PROTECTED.get(dep.engine, []) + list(dep.controller.protected)


def _digest(db, dep: Deployment) -> str:
    return check_digest(records.get_state(db, dep.name, "controller_digest"), dep.name)


def measure_noise(dep: Deployment, home: Home, *, blocks: int | None = None, rev: str = "stock",
                  progress: Progress = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Stock against itself in the paired design; stores σ for the deployment and returns the figures."""
    db = connect(home)
    digest = _digest(db, dep)
    repo = workspace_repo(home, dep)
    stock = checkout(repo, rev, systems_cache(home, dep))
    blocks = blocks or dep.controller.blocks
    run_id = records.add_run(db, dep.name, "noise", stock.tree, stock.tree)
    raw = home.runs / f"{run_id}.jsonl"
    try:
        with lease(home, slots_of(dep)) as (s0, s1):
            run = paired_run(adapter_for(dep, home), stock, stock, (s0, s1), requests_of(dep, home),
                             blocks=blocks, warmup=dep.controller.warmup_requests, raw=raw, progress=progress)  # fmt: skip
    except SystemFailed as e:
        records.fail_run(db, run_id, f"{e}\n{e.log_tail}")
        raise SpecPilotError(f"stock failed during the noise run: {e} (log: {raw.with_suffix('')})") from None
    res = paired_stats(run.blocks)
    within_var, within_df = within_request_spread(run.blocks)
    figures = {"sigma": noise_sigma(res), "gain": res.gain, "lower_bound": res.lower_bound, "unit": res.unit,
               "n": res.n, "block_gains": res.block_gains, "run_id": run_id, "tree": stock.tree,
               "within_var": within_var, "within_df": within_df, "violations": run.violations,
               "disturbances": run.disturbances}  # fmt: skip
    records.finish_run(db, run_id, summary=figures, raw_path=str(raw))
    if run.disturbances:
        raise SpecPilotError(
            f"the stock noise run was disturbed ({run.disturbances[0]}), so its σ was not stored; stop what "
            f"else runs on the slots' cores and rerun `specpilot controller noise --deployment {dep.name}`"
        )
    records.set_state(db, dep.name, "noise", figures)
    records.set_state(db, dep.name, "controller_digest", digest)
    return figures


def _refused(db, dep: Deployment, baseline: SystemTree, cand_tree: str, why: str, sigma: float) -> Evaluation:
    vid = records.add_verdict(db, dep.name, None, baseline.tree, cand_tree, False, False, 0.0, 0.0, sigma, 0.0,
                              "requests", [f"refused: {why}"], {"refused": True})  # fmt: skip
    return Evaluation(vid, None, dep.name, baseline.tree, cand_tree, False, False, 0.0, 0.0, sigma, 0.0,
                      "requests", [f"refused: {why}"], {"refused": True})  # fmt: skip


def compare(
    dep: Deployment,
    home: Home,
    baseline_rev: str,
    candidate_rev: str,
    *,
    blocks: int | None = None,
    audit_output: bool = True,
    progress: Progress = lambda _: None,
) -> Evaluation:
    """Measure a candidate against a baseline, audit its output, and store the verdict."""
    db = connect(home)
    _digest(db, dep)
    noise = records.get_state(db, dep.name, "noise")
    if noise is None:
        raise SpecPilotError(
            f"no stock noise for {dep.name!r} yet; run `specpilot phase0 --deployment {dep.name}` "
            f"(or `specpilot controller noise --deployment {dep.name}`) first"
        )
    sigma = float(noise["sigma"])
    repo = workspace_repo(home, dep)
    cache = systems_cache(home, dep)
    baseline = checkout(repo, baseline_rev, cache)
    try:
        candidate = apply_candidate(repo, baseline, candidate_rev, protected_paths(dep), cache)
    except CandidateRefused as e:
        from .systems import tree_of

        return _refused(db, dep, baseline, tree_of(repo, candidate_rev), str(e), sigma)
    reqs = requests_of(dep, home)
    try:
        run_id, raw, run = _measure(dep, home, db, baseline, candidate, reqs, blocks, progress)
    except _Failed as f:
        reason = f"a system failed during the paired run: {f.error}"
        vid = records.add_verdict(db, dep.name, f.run_id, baseline.tree, candidate.tree, False, False, 0.0, 0.0,
                                  sigma, 0.0, "requests", [reason], {"log_tail": f.error.log_tail})  # fmt: skip
        return Evaluation(vid, f.run_id, dep.name, baseline.tree, candidate.tree, False, False, 0.0, 0.0, sigma,
                          0.0, "requests", [reason], {"log_tail": f.error.log_tail})  # fmt: skip
    res = paired_stats(run.blocks)
    changed = run.changes_output()
    spread = within_request_spread(run.blocks)
    extra = [f"integrity: {v}" for v in run.violations] + _measurement_reasons(run, spread, noise)
    audit_summary: dict[str, Any] | None = None
    if audit_output:
        progress("token-forcing audit")
        result = audit_outputs(dep, home, db, reqs, run.outputs["B"])
        audit_summary = audit_json(result, _contexts(dep, home, result, run.outputs["B"]))
        extra += result.reasons
    verdict = decide(res, sigma, changes_output=bool(changed), min_gain=dep.controller.min_gain,
                     output_change_gain=dep.controller.output_change_gain, extra_reasons=extra)  # fmt: skip
    evidence = {
        "block_gains": res.block_gains, "n": res.n, "log_sd": res.log_sd, "notes": verdict.notes,
        "changed_requests": changed, "violations": run.violations, "disturbances": run.disturbances,
        "within_var": spread[0], "requests": len(reqs),
        "warmup": dep.controller.warmup_requests, "raw": str(raw), "audit": audit_summary,
        "noise_run": noise.get("run_id"),
    }  # fmt: skip
    records.finish_run(db, run_id, summary={"gain": res.gain, "lower_bound": res.lower_bound, "unit": res.unit},
                       raw_path=str(raw))  # fmt: skip
    vid = records.add_verdict(db, dep.name, run_id, baseline.tree, candidate.tree, verdict.approved, bool(changed),
                              res.gain, res.lower_bound, sigma, verdict.threshold, res.unit, verdict.reasons,
                              evidence)  # fmt: skip
    return Evaluation(vid, run_id, dep.name, baseline.tree, candidate.tree, verdict.approved, bool(changed),
                      res.gain, res.lower_bound, sigma, verdict.threshold, res.unit, verdict.reasons, evidence)  # fmt: skip


def _measurement_reasons(run: PairedRun, spread: tuple[float, int], noise: dict[str, Any]) -> list[str]:
    """Why this measurement cannot carry a verdict: other load on the slots, or a within-request
    spread (`spread`: variance and degrees of freedom) that stock's A/A run never shows."""
    reasons = [f"measurement disturbed: {d}; rerun on a quiet machine" for d in run.disturbances]
    var, df = spread
    stock_var, stock_df = noise.get("within_var", math.nan), int(noise.get("within_df", 0))
    p = noisier_than_stock(var, df, stock_var, stock_df)
    if p < NOISE_P:
        reasons.append(
            f"measurement too noisy: the same requests vary {math.sqrt(var):.1%} between blocks against "
            f"{math.sqrt(stock_var):.1%} in stock's A/A run (F-test p = {p:.1e}); rerun on a quiet machine"
        )
    return reasons


class _Failed(Exception):
    def __init__(self, run_id: str, error: SystemFailed):
        self.run_id, self.error = run_id, error


def _measure(dep: Deployment, home: Home, db, baseline: SystemTree, candidate: SystemTree, reqs: list[Request],
             blocks: int | None, progress: Progress):  # fmt: skip
    """One stored paired run of candidate against baseline on the deployment's two leased slots."""
    run_id = records.add_run(db, dep.name, "paired", baseline.tree, candidate.tree)
    raw = home.runs / f"{run_id}.jsonl"
    try:
        with lease(home, slots_of(dep)) as (s0, s1):
            run = paired_run(adapter_for(dep, home), baseline, candidate, (s0, s1), reqs,
                             blocks=blocks or dep.controller.blocks, warmup=dep.controller.warmup_requests,
                             raw=raw, progress=progress)  # fmt: skip
    except SystemFailed as e:
        records.fail_run(db, run_id, f"{e}\n{e.log_tail}")
        raise _Failed(run_id, e) from None
    return run_id, raw, run


def quick_compare(dep: Deployment, home: Home, baseline_rev: str, candidate_rev: str, *, blocks: int = 1,
                  max_requests: int | None = 4, progress: Progress = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """A short paired measurement for a sub-agent: gain and bound, no audit, never a verdict.

    Approval happens only in the round; this only tells an agent whether it is on the right track.
    """
    db = connect(home)
    _digest(db, dep)
    repo = workspace_repo(home, dep)
    cache = systems_cache(home, dep)
    baseline = checkout(repo, baseline_rev, cache)
    try:
        candidate = apply_candidate(repo, baseline, candidate_rev, protected_paths(dep), cache)
    except CandidateRefused as e:
        return {"refused": str(e), "note": "not a verdict: approval happens only in the round"}
    reqs = requests_of(
        dep, home, limit=(max_requests + dep.controller.warmup_requests) if max_requests else None
    )
    try:
        run_id, _, run = _measure(dep, home, db, baseline, candidate, reqs, blocks, progress)
    except _Failed as f:
        return {"failed": str(f.error), "log_tail": f.error.log_tail, "run_id": f.run_id}
    res = paired_stats(run.blocks)
    out = {"gain": res.gain, "lower_bound": res.lower_bound, "unit": res.unit, "n": res.n,
           "changed_requests": run.changes_output(), "violations": run.violations,
           "disturbances": run.disturbances, "run_id": run_id,
           "candidate_tree": candidate.tree, "note": "not a verdict: approval happens only in the round"}  # fmt: skip
    records.finish_run(db, run_id, summary={"quick": True, **out})
    return out


def audit_outputs(
    dep: Deployment, home: Home, db, reqs: list[Request], outputs: dict[str, list[int]]
) -> AuditResult:
    """Score a system's outputs and compare them with stock's Phase 0 figures."""
    from .phase0 import load_stock_scored
    from .scorer import scorer_for

    phase0 = records.get_state(db, dep.name, "phase0")
    if phase0 is None:
        raise SpecPilotError(
            f"no Phase 0 for {dep.name!r}; run `specpilot phase0 --deployment {dep.name}` first"
        )
    stock = {s.id: s for s in load_stock_scored(Path(phase0["stock_scored"]))}
    by_id = {r.id: r for r in reqs}
    with scorer_for(dep, home) as scorer:
        cand = [scorer.score(rid, by_id[rid].input_ids, toks) for rid, toks in outputs.items()]
    return audit(cand, [stock[o.id] for o in cand if o.id in stock], float(phase0["delta"]))


def _contexts(dep: Deployment, home: Home, result: AuditResult, outputs: dict[str, list[int]]) -> list[dict]:
    """The first events with the text around them: `…before [system token|scorer's argmax]`."""
    from tokenizers import Tokenizer

    from specpilot.deployments.workloads.chat import target_folder

    tok = Tokenizer.from_file(str(target_folder(dep, home) / "tokenizer.json"))
    events = []
    for e in result.events[:50]:
        before = tok.decode(outputs[e.id][max(0, e.position - 12) : e.position])
        d = asdict(e)
        d["context"] = f"{before}[{tok.decode([e.token])}|{tok.decode([e.argmax])}]".replace("\n", "⏎")
        events.append(d)
    return events


def audit_json(result: AuditResult, events: list[dict] | None = None) -> dict[str, Any]:
    return {
        "passed": result.passed, "rate": result.rate, "mismatches": result.mismatches, "positions": result.positions,
        "stock_rate": result.stock_rate, "stock_mismatches": result.stock_mismatches,
        "stock_positions": result.stock_positions, "delta": result.delta, "large": len(result.events),
        "stock_large": result.stock_events, "p_large": result.p_large if math.isfinite(result.p_large) else None,
        "unexplained": len(result.unexplained), "reasons": result.reasons,
        "events": events if events is not None else [asdict(e) for e in result.events[:50]],
    }  # fmt: skip


def audit_system(
    dep: Deployment, home: Home, rev: str, *, progress: Progress = lambda _: None
) -> dict[str, Any]:
    """Run one system on the deployment's first slot and audit its output against stock's."""
    from .paired import run_period

    db = connect(home)
    _digest(db, dep)
    system = checkout(workspace_repo(home, dep), rev, systems_cache(home, dep))
    reqs = requests_of(dep, home)
    run_id = records.add_run(db, dep.name, "audit", system.tree)
    logs = home.runs / run_id
    progress(f"running {system.tree[:12]} on every request")
    try:
        with lease(home, slots_of(dep)[:1]) as (s0,):
            period = run_period(adapter_for(dep, home), {"S": system}, {"S": s0}, reqs, logs, "audit")
    except SystemFailed as e:
        records.fail_run(db, run_id, f"{e}\n{e.log_tail}")
        raise SpecPilotError(f"the system failed during the audit: {e} (logs in {logs})") from None
    outputs = {r.id: period.results["S"][r.id].tokens for r in reqs}
    progress("scoring by token forcing")
    result = audit_outputs(dep, home, db, reqs, outputs)
    data = {
        "tree": system.tree,
        "run_id": run_id,
        **audit_json(result, _contexts(dep, home, result, outputs)),
    }
    records.finish_run(db, run_id, summary=data, raw_path=str(logs))
    return data


def cost_report(dep: Deployment, home: Home, rev: str, *, max_requests: int | None = None) -> dict[str, Any]:
    """The cost-model report of a system (profile + exact replay on the first slot), as JSON data."""
    from specpilot.costmodel import measure

    system = checkout(workspace_repo(home, dep), rev, systems_cache(home, dep))
    s0 = slots_of(dep)[0]
    with lease(home, [s0]):
        report = measure(dep, home, tree=system.path, slot=str(s0), requests=request_file(dep, home),
                         system=system.tree, max_requests=max_requests)  # fmt: skip
    return report.to_dict()
