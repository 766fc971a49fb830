"""The token-forcing audit of a system's output (paper §3.4), against stock's Phase 0 figures.

The scorer (the pristine stock target, FP32 head) is run teacher-forced over prompt + output; the
candidate's mismatch rate and its large mismatches (margin ≥ 2δ) are compared with stock's
(forcing.py). A large mismatch is explained when the baseline of the same run chose the same token.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import connect, records

from .adapters import adapter_for
from .context import digest, draw_requests, flatten, more_requests, slots_of, workspace
from .engine import Request, SystemFailed
from .forcing import AuditResult, ScoredOutput, audit
from .paired import run_period
from .slots import lease
from .systems import checkout

Progress = Any


def load_stock_scored(path: Path) -> list[ScoredOutput]:
    try:
        return [ScoredOutput(**d) for d in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError) as e:
        raise SpecPilotError(f"{path}: stock's scored outputs are unreadable ({e}); rerun Phase 0") from None


def audit_outputs(dep: Deployment, home: Home, db, reqs: list[Request], outputs: dict[str, list[int]],
                  baseline: dict[str, list[int]] | None = None) -> AuditResult:  # fmt: skip
    """Score a system's outputs and compare them with stock's Phase 0 figures."""
    from .scorer import scorer_for

    phase0 = records.get_state(db, dep.name, "phase0")
    if phase0 is None:
        raise SpecPilotError(
            f"no Phase 0 for {dep.name!r}; run `specpilot phase0 --deployment {dep.name}` first"
        )
    stock = load_stock_scored(Path(phase0["stock_scored"]))
    by_id = {r.id: r for r in reqs}
    with scorer_for(dep, home) as scorer:
        cand = [scorer.score(rid, by_id[rid].input_ids, toks) for rid, toks in outputs.items()]
    explained = None
    if baseline is not None:
        explained = {(o.id, i) for o in cand for i, t in enumerate(o.tokens)
                     if i < len(baseline.get(o.id, [])) and baseline[o.id][i] == t}  # fmt: skip
    return audit(cand, stock, float(phase0["delta"]), explained)


def top_up(dep: Deployment, home: Home, system, reqs: list[Request], draw: dict, outputs: dict[str, list[int]],
           logs: Path) -> tuple[list[Request], dict[str, list[int]], dict | None]:  # fmt: skip
    """An approval's audit material: the run's requests and outputs, with fresh pool requests run
    untimed on the first slot until they hold `controller.audit_positions` output positions (the
    planted defect changes 16 of 35 HumanEval requests, so none of a tiny period's four ~9% of the
    time). (requests, outputs, the added requests' draw or None)."""
    need = dep.controller.audit_positions - sum(len(t) for t in outputs.values())
    if need <= 0:
        return reqs, outputs, None
    per = max(1, round(sum(r.max_new_tokens for r in reqs) / len(reqs)))
    extra, more = more_requests(dep, home, draw, math.ceil(need / per), len(reqs))
    if not extra:
        return reqs, outputs, None
    with lease(home, slots_of(dep)[:1]) as (s0,):
        period = run_period(adapter_for(dep, home), {"S": system}, {"S": s0}, [{"S": extra}], logs, "audit")
    added = {r.id: period.results["S"][r.id].tokens for r in extra}
    return reqs + extra, outputs | added, more


def contexts(dep: Deployment, home: Home, result: AuditResult, outputs: dict[str, list[int]]) -> list[dict]:
    """The first events with the text around them: `…before [system token|scorer's argmax]`."""
    from tokenizers import Tokenizer

    from specpilot.deployments.workloads import target_folder

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
    """Run one system on the deployment's first slot over drawn requests and audit its output."""
    db = connect(home)
    digest(db, dep, home)
    ws = workspace(home, dep)
    system = checkout(ws.repo_dir, rev, ws.systems_cache)
    reqs, draw = draw_requests(dep, home)
    run_id = records.add_run(db, dep.name, "audit", system.tree)
    logs = home.runs / run_id
    progress(f"running {system.tree[:12]} on every request")
    try:
        with lease(home, slots_of(dep)[:1]) as (s0,):
            period = run_period(
                adapter_for(dep, home), {"S": system}, {"S": s0}, [{"S": reqs}], logs, "audit"
            )
    except SystemFailed as e:
        records.fail_run(db, run_id, f"{e}\n{e.log_tail}")
        raise SpecPilotError(f"the system failed during the audit: {e} (logs in {logs})") from None
    reqs, outputs = flatten(reqs, {r.id: period.results["S"][r.id].tokens for r in reqs})
    progress("scoring by token forcing")
    result = audit_outputs(dep, home, db, reqs, outputs)
    data = {
        "tree": system.tree,
        "run_id": run_id,
        "draw": draw,
        **audit_json(result, contexts(dep, home, result, outputs)),
    }
    records.finish_run(db, run_id, summary=data, raw_path=str(logs))
    return data
