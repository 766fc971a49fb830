"""The token-forcing audit of a system's output (paper §3.4), against stock's Phase 0 figures.

The scorer (the pristine stock target, FP32 head) is run teacher-forced over prompt + output; the
candidate's mismatch rate and its large mismatches (margin ≥ 2δ) are compared with stock's
(forcing.py). A large mismatch is explained when the baseline of the same run chose the same token.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import connect, records

from . import checks
from .adapters import adapter_for
from .context import digest, draw_requests, flatten, more_requests, slots_of, workspace
from .engine import Request, SystemFailed
from .forcing import AuditResult, ScoredOutput, audit
from .paired import paired_run
from .period import run_period
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


def top_up(dep: Deployment, home: Home, baseline, candidate, reqs: list[Request], draw: dict,
           outputs: dict[str, list[int]], base_outputs: dict[str, list[int]], raw: Path,
           check_trees: Callable[[], None] = lambda: None) -> dict:  # fmt: skip
    """The audit material of an approval or an output-changing candidate: the run's requests and
    outputs (the baseline's beside them, to explain a mismatch), with fresh pool requests until
    they hold `controller.audit_positions` output positions (the planted defect changes 16 of 35
    HumanEval requests, so none of a tiny period's four ~9% of the time).

    The added requests come as further draws, each shaped exactly as a timed run's (as many
    warm-up and measured requests of each set, a batch deployment's groups, ids from r00) and served
    as a timed round is — baseline and candidate in the deployment's design — so nothing a system
    sees in its process (how many requests, their shape, their ids) tells the runs the audit alone
    scores from the timed ones; their times are kept (`raw`), never used.
    Returns {"reqs", "outputs", "base_outputs", "draw" (the added requests' or None), "violations"}."""
    out = {"reqs": reqs, "outputs": outputs, "base_outputs": base_outputs, "draw": None, "violations": []}
    need = dep.controller.audit_positions - sum(len(t) for t in outputs.values())
    used = set(draw["sources"].values())
    warm = dep.controller.warmup_requests
    added: list[Request] = []
    got: dict[str, dict[str, list[int]]] = {"A": {}, "B": {}}
    sources, seeds, violations = {}, [], []
    while need > 0:
        more = more_requests(dep, home, used)
        if more is None:  # the pool is spent: the audit scores what it has
            break
        extra, shape = more
        used |= set(shape["sources"].values())
        with lease(home, slots_of(dep)) as slots:
            run = paired_run(adapter_for(dep, home), baseline, candidate, slots, extra, rounds=1, warmup=warm,
                             raw=raw, design=dep.design, seed=random.SystemRandom().getrandbits(32),
                             check_trees=check_trees)  # fmt: skip
        k = len(seeds)
        flat, outs = flatten(extra[warm:], run.outputs.get("B", {}))
        base = flatten(extra[warm:], run.outputs.get("A", {}))[1]
        for q in flat:  # apart from the timed run's ids: a{k}/r03, a{k}/b4/r03
            rid = f"a{k}/{q.id}"
            added.append(Request(rid, q.input_ids, q.max_new_tokens))
            sources[rid] = shape["sources"][q.id.rsplit("/", 1)[-1]]
            got["B"][rid], got["A"][rid] = outs.get(q.id, []), base.get(q.id, [])
        need -= sum(len(v) for v in outs.values())
        seeds.append(shape["seed"])
        violations += run.violations + checks.violations(run)
    if not added:
        return out
    return out | {"reqs": reqs + added, "outputs": outputs | got["B"], "base_outputs": base_outputs | got["A"],
                  "draw": {"seeds": seeds, "sources": sources}, "violations": violations}  # fmt: skip


def contexts(dep: Deployment, home: Home, result: AuditResult, outputs: dict[str, list[int]]) -> list[dict]:
    """The first events with the text around them: `…before [system token|scorer's argmax]`."""
    from tokenizers import Tokenizer

    from specpilot.deployments.workloads import target_folder

    tok = Tokenizer.from_file(str(target_folder(dep, home) / "tokenizer.json"))
    known = tok.get_vocab_size()

    def text(ids: list[int]) -> str:
        """The ids' text; an id past the tokenizer (a synthetic target's wider vocabulary) as ⟨id⟩."""
        runs, run = [], []
        for i in ids:
            if i < known:
                run.append(i)
                continue
            runs += [tok.decode(run), f"⟨{i}⟩"]
            run = []
        return "".join([*runs, tok.decode(run)])

    events = []
    for e in result.events[:50]:
        before = text(outputs[e.id][max(0, e.position - 12) : e.position])
        d = asdict(e)
        d["context"] = f"{before}[{text([e.token])}|{text([e.argmax])}]".replace("\n", "⏎")
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
