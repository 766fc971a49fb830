"""The controller's judgements: stock noise (A/A) and candidate-vs-baseline comparisons.

Every judgement checks the controller's own digest first, takes the deployment's slots under a
lease, runs from clean exports of the workspace repository (never an agent's worktree; each
export re-hashed around every period), on requests drawn afresh from the pool (context.py),
writes its raw timestamps to `<home>/runs/<run id>.jsonl`, and stores the run and the verdict.

A comparison is sequential (stats.py): blocks are added until a look decides it, the time budget
is spent, or `max_blocks` is reached. A block with other load on its slots is set aside (named in
the verdict) and measured again; a comparison where more than a quarter of the blocks were
disturbed gets no verdict.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError, differing
from specpilot.memory_store import connect, records, write_tree

from . import checks
from .adapters import adapter_for
from .audit import audit_json, audit_outputs, contexts, top_up
from .context import (
    digest,
    draw_requests,
    flatten,
    protected_paths,
    slots_of,
    tuning_requests,
    workspace,
)
from .engine import Request, SystemFailed
from .load import summarize
from .noise import noise_key, noise_state, pooled_noise
from .paired import PairedRun, paired_run
from .refspec_system import tool_jail
from .slots import lease
from .stats import MIN_LOOK, decide, look_levels, paired_stats, sigma_for
from .systems import CandidateRefused, SystemTree, apply_candidate, checkout, tree_of

Progress = Callable[[str], None]
# Said in every verdict judged where no cgroup could be made (controller.cgroups = "optional").
UNCONFINED = (
    'judged without cgroups (controller.cgroups = "optional"): each system\'s cores by affinity, '
    "its turns by process-group signals, its CPU time from /proc; the work check after its "
    "last request did not run"
)
# Said in every approval whose requests came from the public sets (neither held-out nor composed prompts).
PUBLIC = (
    "judged on the public prompt sets (secret-tagged): a candidate that ships their answers and drafts "
    "from them would gain here and on no other prompts; `specpilot workloads held-out add` judges on "
    'prompts of your own that no agent or system has seen (or controller.prompts = "composed", on a '
    "pool the controller samples at Phase 0)"
)
MAX_DISTURBED = 0.25  # share of blocks that may be set aside for other load before a run gets no verdict


# A verdict as the controller returns it is the record it stored: one type, memory_store's.
Evaluation = records.VerdictRecord


def _store(db, dep: Deployment, run_id: str | None, base: str, cand: str, approved: bool, changed: bool,
           gain: float, lb: float, sigma: float, threshold: float, reasons: list[str], evidence: dict) -> Evaluation:  # fmt: skip
    return records.add_verdict(db, deployment=dep.name, run_id=run_id, baseline_tree=base, candidate_tree=cand,
                               approved=approved, changes_output=changed, gain=gain, lower_bound=lb, sigma=sigma,
                               threshold=threshold, unit="blocks", reasons=reasons, evidence=evidence)  # fmt: skip


def _tree_check(repo, systems: list[SystemTree]) -> Callable[[], None]:
    """Re-hash the exports: a changed export stops the run (and is dropped, to be exported again)."""

    def check() -> None:
        for s in systems:
            got = write_tree(repo, s.path)
            if got != s.tree:
                import shutil

                shutil.rmtree(s.path, ignore_errors=True)
                was, now = differing(s.tree, got)
                raise _Tampered(f"the export of {was} changed during the run (now {now})")

    return check


class _Tampered(Exception):
    pass


class _Failed(Exception):
    def __init__(self, run_id: str, error: Exception):
        self.run_id, self.error = run_id, error


def _blocks(dep: Deployment, home: Home, db, kind: str, baseline: SystemTree, candidate: SystemTree,
            reqs: list[Request], progress: Progress, *, fixed: int | None,
            keep_going: Callable[[PairedRun, float], bool], pace: list | None = None,
            ) -> tuple[str, Any, PairedRun]:  # fmt: skip
    """Blocks of a paired run (fixed many, or while `keep_going(run, elapsed)`), stored as one run;
    `pace` gets (seconds in, blocks) after each round."""
    run_id = records.add_run(db, dep.name, kind, baseline.tree, candidate.tree)
    raw = home.runs / f"{run_id}.jsonl"
    check = _tree_check(workspace(home, dep).repo_dir, [baseline, candidate])
    t0, run = time.monotonic(), None
    try:
        # a judged run refuses a GPU another process computes on; an agent's quick look shares it
        with lease(home, slots_of(dep), timed=kind != "quick") as slots:
            while True:
                run = paired_run(adapter_for(dep, home), baseline, candidate, slots, reqs, rounds=1,
                                 warmup=dep.controller.warmup_requests, raw=raw, design=dep.design,
                                 seed=int(run_id[:8], 16),
                                 progress=progress, check_trees=check, run=run)  # fmt: skip
                if pace is not None:
                    pace.append((time.monotonic() - t0, len(run.blocks)))
                if (fixed is not None and len(run.blocks) >= fixed) or (
                    fixed is None and not keep_going(run, time.monotonic() - t0)
                ):
                    break
    except (SystemFailed, _Tampered) as e:
        records.fail_run(db, run_id, f"{e}\n{getattr(e, 'log_tail', '')}")
        raise _Failed(run_id, e) from None
    except SpecPilotError as e:  # refused (a GPU another process computes on): no run stays `running`
        records.fail_run(db, run_id, str(e))
        raise
    return run_id, raw, run


def quiet_blocks(run: PairedRun) -> list[list]:
    return [b for b, d in zip(run.blocks, run.block_disturbances, strict=True) if not d]


def measure_noise(dep: Deployment, home: Home, *, blocks: int | None = None, rev: str = "stock",
                  progress: Progress = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Stock against itself in the paired design; adds its block gains to the deployment's A/A record."""
    db = connect(home)
    dig = digest(db, dep, home)
    ws = workspace(home, dep)
    stock = checkout(ws.repo_dir, rev, ws.systems_cache)
    reqs, draw = draw_requests(dep, home)
    pace: list[tuple[float, int]] = []
    try:
        run_id, raw, run = _blocks(dep, home, db, "noise", stock, stock, reqs, progress,
                                   fixed=blocks or dep.controller.blocks, keep_going=lambda *_: False, pace=pace)  # fmt: skip
    except _Failed as f:
        raise SpecPilotError(f"stock failed during the noise run: {f.error}") from None
    quiet = quiet_blocks(run)
    if len(quiet) < 2 or len(run.blocks) - len(quiet) > MAX_DISTURBED * len(run.blocks):
        records.finish_run(db, run_id, summary={"disturbances": run.disturbances}, raw_path=str(raw))
        raise SpecPilotError(
            f"the stock noise run was disturbed ({summarize(run.disturbances)}), so its σ was not stored; stop "
            f"what else runs on the slots and rerun `specpilot controller noise --deployment {dep.name}`"
        )
    res = paired_stats(quiet)
    logs = [math.log(g) for g in res.block_gains]
    old = records.get_state(db, dep.name, "noise") or {}
    key = noise_key(dep)
    runs = [*old.get("runs", []), {"run_id": run_id, **key, "block_logs": logs}]
    sd, df = pooled_noise(runs, key)
    figures = {**key, "runs": runs, "pooled_sd": sd, "df": df, "sigma": sigma_for(sd, len(quiet)),
               "gain": res.gain, "lower_bound": res.lower_bound, "n": res.n, "run_id": run_id, "tree": stock.tree,
               "violations": checks.violations(run), "set_aside": len(run.blocks) - len(quiet), "draw": draw,
               # seconds until a comparison's first look (MIN_LOOK blocks): what a round keeps for each direction
               "look_s": next((t for t, n in pace if n >= MIN_LOOK), pace[-1][0] if pace else 0.0)}  # fmt: skip
    records.finish_run(db, run_id, summary=figures, raw_path=str(raw))
    records.set_state(db, dep.name, "noise", figures)
    records.set_state(db, dep.name, "controller_digest", dig)
    _record_speed(db, dep, stock.tree, run.design, checks.request_speeds(run, "A", draw["sources"]))
    return figures


def _record_speed(db, dep: Deployment, tree: str, design: str, by_request: dict[str, float]) -> None:
    """Add a tree's per-request speeds (pool id -> tok/s) to its record in this design."""
    speeds = records.get_state(db, dep.name, "speeds") or {}
    old = speeds.get(f"{tree}:{design}")
    speeds[f"{tree}:{design}"] = (old if isinstance(old, dict) else {}) | by_request
    records.set_state(db, dep.name, "speeds", speeds)


def compare(
    dep: Deployment,
    home: Home,
    baseline_rev: str,
    candidate_rev: str,
    *,
    blocks: int | None = None,
    audit_output: bool = True,
    budget_s: float | None = None,
    progress: Progress = lambda _: None,
) -> Evaluation:
    """Measure a candidate against a baseline (sequentially, or `blocks` blocks), audit its output,
    and store the verdict. `budget_s`: measure at most this long, if less than the deployment's
    budget (what a round has left for this comparison)."""
    db = connect(home)
    digest(db, dep, home)
    noise = noise_state(db, dep)
    ws = workspace(home, dep)
    repo, cache = ws.repo_dir, ws.systems_cache
    baseline = checkout(repo, baseline_rev, cache)
    try:
        candidate = apply_candidate(repo, baseline, candidate_rev, protected_paths(dep), cache)
    except CandidateRefused as e:
        return _store(db, dep, None, baseline.tree, tree_of(repo, candidate_rev), False, False, 0.0, 0.0,
                      float(noise["sigma"]), 0.0, [f"refused: {e}"], {"refused": True})  # fmt: skip
    speeds = records.get_state(db, dep.name, "speeds") or {}
    record = speeds.get(f"{baseline.tree}:{dep.design}")
    reqs, draw = draw_requests(
        dep, home, anchors=frozenset(record) if isinstance(record, dict) else frozenset()
    )
    c = dep.controller
    budget = c.budget_s if budget_s is None else max(0.0, min(c.budget_s, budget_s))
    sd = float(noise["pooled_sd"])
    aa = (sd, int(noise.get("df") or 0))  # the A/A spread, for checks.repeat_gain
    state: dict[str, Any] = {}

    def keep_going(run: PairedRun, elapsed: float) -> bool:
        quiet = quiet_blocks(run)
        state.setdefault("t", []).append((elapsed, len(run.blocks)))
        if (
            run.violations
            or checks.violations(run)
            or checks.repeat_gain(run, aa)
            or len(run.blocks) - len(quiet) > max(1, MAX_DISTURBED * len(run.blocks))
        ):
            return False
        if len(quiet) < MIN_LOOK:  # a verdict needs MIN_LOOK quiet blocks, whatever the budget
            return len(run.blocks) < c.max_blocks
        final = elapsed >= budget or len(run.blocks) >= c.max_blocks
        if (
            "k_max" not in state
        ):  # planned looks: fixed at the first look from the blocks' pace (not their gains)
            (t0, n0), (t1, n1) = state["t"][0], state["t"][-1]
            pace = (t1 - t0) / (n1 - n0) if n1 > n0 else t1 / n1  # seconds per block, start-up aside
            state["k_max"] = max(
                MIN_LOOK, min(c.max_blocks, int(len(quiet) + (budget - elapsed) / max(pace, 1e-3)))
            )
        prev = state.get("last", 0)  # the previous look's block count
        if len(quiet) == prev:  # no quiet block since that look (all disturbed): no α to spend on a look
            return not final
        verdict, _ = _look(
            run, quiet, state["k_max"], sd, c, final or len(quiet) >= state["k_max"], prev=prev
        )
        state["look"], state["last"] = (len(quiet), prev), len(quiet)
        return not verdict.decided

    try:
        run_id, raw, run = _blocks(dep, home, db, "paired", baseline, candidate, reqs, progress, fixed=blocks,
                                   keep_going=keep_going)  # fmt: skip
    except _Failed as f:
        reason = f"a system failed during the paired run: {f.error}"
        return _store(db, dep, f.run_id, baseline.tree, candidate.tree, False, False, 0.0, 0.0, float(noise["sigma"]),
                      0.0, [reason], {"log_tail": getattr(f.error, "log_tail", ""), "draw": draw})  # fmt: skip
    quiet = quiet_blocks(run)
    changed = run.changes_output()
    fatal = [f"integrity: {v}" for v in run.violations + checks.violations(run) + checks.repeat_gain(run, aa)]
    fatal += [f"integrity: {v}" for v in checks.baseline_slowed(run, record, draw["sources"])]
    set_aside = len(run.blocks) - len(quiet)
    if set_aside > max(1, MAX_DISTURBED * len(run.blocks)) or (set_aside and len(quiet) < MIN_LOOK):
        fatal.append(f"measurement disturbed in {set_aside} of {len(run.blocks)} blocks "
                     f"({summarize(run.disturbances)}): no verdict")  # fmt: skip
    elif len(quiet) < MIN_LOOK and not fatal:
        fatal.append(f"only {len(quiet)} blocks were measured (a verdict needs {MIN_LOOK}): no verdict")
    if len(quiet) < 2:
        evidence = {"draw": draw, "violations": fatal, "disturbances": run.disturbances, "raw": str(raw)}
        records.finish_run(db, run_id, summary={"blocks": len(run.blocks)}, raw_path=str(raw))
        return _store(db, dep, run_id, baseline.tree, candidate.tree, False, bool(changed), 0.0, 0.0,
                      float(noise["sigma"]), 0.0, fatal, evidence)  # fmt: skip
    k_max = state.get("k_max", max(MIN_LOOK, len(quiet)))
    # The verdict is the last look's when the run ended at it (same α); else a look of its own.
    at, prev = state.get("look", (None, 0))
    prev = prev if at == len(quiet) else state.get("last", 0)
    verdict, res = _look(run, quiet, k_max, sd, c, True, fatal, prev)
    audit_summary: dict[str, Any] | None = None
    if audit_output and (verdict.approved or changed):  # approved on speed, or its output differs: score it
        progress("token-forcing audit")
        audited, outputs = flatten(reqs, run.outputs["B"])  # a batch deployment's groups, request by request
        base_outputs = flatten(reqs, run.outputs["A"])[1]
        top = None
        try:  # enough positions for any output-changing candidate, not only for an approval
            got = top_up(dep, home, baseline, candidate, audited, draw, outputs, base_outputs,
                         home.runs / f"{run_id}-audit.jsonl", _tree_check(repo, [baseline, candidate]))  # fmt: skip
            audited, outputs, base_outputs, top = (
                got["reqs"],
                got["outputs"],
                got["base_outputs"],
                got["draw"],
            )
            fatal += [f"integrity (audit's added requests): {v}" for v in got["violations"]]
        except SystemFailed as e:
            fatal.append(f"audit: a system failed on the audit's added requests: {e}")
        except _Tampered as e:
            fatal.append(f"audit: {e} (on the audit's added requests)")
        result = audit_outputs(dep, home, db, audited, outputs, base_outputs)
        audit_summary = audit_json(result, contexts(dep, home, result, outputs)) | {"top_up": top}
        # lossless or not is decided on every output pair the controller holds, the audit's added ones too
        more = [] if changed else sorted(i for i in outputs if outputs[i] != base_outputs.get(i))
        changed = changed or more
        if result.reasons or fatal or more:
            verdict, res = _look(run, quiet, k_max, sd, c, True, fatal + result.reasons, prev, bool(changed))
    sigma = sigma_for(sd, len(quiet))
    if any(u.get("cpuset") is False for p in run.periods for u in p.usage.values()):
        verdict.notes.append(UNCONFINED)
    if run.own_costs:  # gpu_load.py: a system's own draw, not something else's
        verdict.notes.append(f"turns ran under the GPU's power cap ({summarize(run.own_costs)}): the clocks a "
                             "system's own kernels' draw cost it are in its time")  # fmt: skip
    if verdict.approved and not draw.get("held_out") and not draw.get("composed"):
        verdict.notes.append(PUBLIC)
    if (
        budget < c.budget_s
        and not verdict.approved
        and not fatal
        and res.upper_bound >= 1 + verdict.threshold
    ):
        verdict.notes.append(f"undecided when the round's judging budget ended it ({budget:.0f} s, {res.n} blocks; "
                             f"the deployment's own is {c.budget_s:.0f} s): `specpilot controller compare` judges "
                             f"it alone")  # fmt: skip
    evidence = {
        "design": run.design, "block_gains": res.block_gains, "n": res.n, "log_sd": res.log_sd,
        "request_gains": [[round(math.exp(r.log_ratio()), 5) for r in blk] for blk in quiet],
        "level": res.level, "notes": verdict.notes, "changed_requests": changed, "violations": fatal,
        "disturbances": run.disturbances, "set_aside": set_aside, "requests": len(reqs), "draw": draw,
        "warmup": c.warmup_requests, "raw": str(raw), "audit": audit_summary,
        "noise_runs": [r["run_id"] for r in noise["runs"]], "k_max": state.get("k_max"),
        "ready_s": [{lb: u.get("ready_s") for lb, u in p.usage.items()} for p in run.periods],
        "rounds_s": [[round(t, 1), n] for t, n in state.get("t", [])],  # (seconds in, blocks) after each round
    }  # fmt: skip
    records.finish_run(db, run_id, summary={"gain": res.gain, "lower_bound": res.lower_bound, "blocks": res.n},
                       raw_path=str(raw))  # fmt: skip
    if verdict.approved:
        _record_speed(db, dep, candidate.tree, run.design, checks.request_speeds(run, "B", draw["sources"]))
    return _store(db, dep, run_id, baseline.tree, candidate.tree, verdict.approved, bool(changed), res.gain,
                  res.lower_bound, sigma, verdict.threshold, verdict.reasons, evidence)  # fmt: skip


def _look(
    run: PairedRun,
    quiet: list,
    k_max: int,
    sd: float,
    c,
    final: bool,
    fatal: list[str] = (),
    prev: int = 0,
    changed: bool | None = None,
):
    """The sequential look at the quiet blocks so far (the previous look at `prev`): (Verdict, PairedStats).
    `changed`: the candidate changes the output (default: on the run's own requests)."""
    alpha, beta = look_levels(len(quiet), k_max, prev)
    res = paired_stats(quiet, level=alpha, futility=beta)
    changed = bool(run.changes_output()) if changed is None else changed
    verdict = decide(res, sigma_for(sd, len(quiet)), changes_output=changed,
                     min_gain=c.min_gain, output_change_gain=c.output_change_gain, extra_reasons=fatal, final=final)  # fmt: skip
    return verdict, res


def quick_compare(dep: Deployment, home: Home, baseline_rev: str, candidate_rev: str, *, blocks: int = 1,
                  max_requests: int | None = 4, progress: Progress = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """A short paired measurement for a sub-agent on the tuning requests: gain, never a verdict.

    Approval happens only in the round; this only tells an agent whether it is on the right track.
    """
    db = connect(home)
    digest(db, dep, home)
    ws = workspace(home, dep)
    repo, cache = ws.repo_dir, ws.systems_cache
    baseline = checkout(repo, baseline_rev, cache)
    try:
        candidate = apply_candidate(repo, baseline, candidate_rev, protected_paths(dep), cache)
    except CandidateRefused as e:
        return {"refused": str(e), "note": "not a verdict: approval happens only in the round"}
    limit = (max_requests + dep.controller.warmup_requests) if max_requests else None
    reqs = tuning_requests(dep, home, limit=limit)
    try:
        run_id, _, run = _blocks(dep, home, db, "quick", baseline, candidate, reqs, progress, fixed=blocks,
                                 keep_going=lambda *_: False)  # fmt: skip
    except _Failed as f:
        return {"failed": str(f.error), "log_tail": getattr(f.error, "log_tail", ""), "run_id": f.run_id}
    res = paired_stats(run.blocks)
    out = {"gain": res.gain, "blocks": res.n, "changed_requests": run.changes_output(),
           "violations": run.violations + checks.violations(run), "disturbances": run.disturbances, "run_id": run_id,
           "candidate_tree": candidate.tree, "note": "not a verdict: approval happens only in the round"}  # fmt: skip
    records.finish_run(db, run_id, summary={"quick": True, **out})
    return out


def cost_report(dep: Deployment, home: Home, rev: str, *, max_requests: int | None = None) -> dict[str, Any]:
    """The cost-model report of a system (profile + exact replay on the first slot), as JSON data."""
    from specpilot.costmodel import measure
    from specpilot.deployments.workloads import request_file

    ws = workspace(home, dep)
    system = checkout(ws.repo_dir, rev, ws.systems_cache)
    s0 = slots_of(dep)[0]
    with lease(home, [s0]):
        report = measure(dep, home, tree=system.path, slot=str(s0), requests=request_file(dep, home),
                         system=system.tree, max_requests=max_requests, jail=tool_jail(dep, home))  # fmt: skip
    return report.to_dict()
