"""Phase 0 of a deployment: calibrate δ, score stock, measure stock noise (paper §3.4).

Stock and AR (the same engine with speculation off) run the deployment's requests side by side.
At each request's first divergence the scorer gives the log-probability gap between the two
tokens; δ is the largest gap rounded up to a multiple of 1/8. Stock's own token-forcing figures
(mismatch rate, large mismatches at ≥ 2δ) are the yardstick every candidate's audit is held to,
and stock's scored outputs are kept so an audit can say which events stock does not share.
Phase 0 records the controller's digest: from then on it refuses to judge if its source changes.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError, set_knob
from specpilot.deployments.stock import LAUNCH_FILE
from specpilot.memory_store import connect, records

from . import composed, held_out
from .adapters import adapter_for
from .context import draw_requests, flatten, judge_digest, slots_of, workspace
from .engine import Group, SystemFailed
from .evaluate import Progress, measure_noise
from .forcing import audit, calibrate_delta
from .period import run_period
from .scorer import scorer_for
from .slots import lease
from .systems import SystemTree, checkout

# Per engine, the knobs file holding `decode.mode`: "ar" turns speculation off.
AR_KNOB_FILE = {"refspec": "refspec.toml", "sglang": LAUNCH_FILE}


def ar_variant(dep: Deployment, stock: SystemTree, cache: Path) -> SystemTree:
    """The stock tree with speculation turned off: the engine's own AR."""
    knobs = AR_KNOB_FILE.get(dep.engine)
    if knobs is None or not (stock.path / knobs).is_file():
        raise SpecPilotError(
            f"deployment {dep.name!r}: no AR variant for engine {dep.engine!r}: its stock tree has no {knobs}"
        )
    path = cache / f"{stock.tree}-ar"
    if not path.is_dir():
        tmp = cache / f".{stock.tree}-ar.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(stock.path, tmp)
        set_knob(tmp / knobs, "decode.mode", "ar")
        tmp.rename(path)
    return SystemTree(f"{stock.tree}-ar", path)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def run_phase0(
    dep: Deployment, home: Home, *, blocks: int | None = None, progress: Progress = lambda _: None
) -> dict[str, Any]:
    """Run Phase 0 and store its figures as the deployment's `phase0` state."""
    db = connect(home)
    ws = workspace(home, dep)
    repo, cache = ws.repo_dir, ws.systems_cache
    stock = checkout(repo, "stock", cache)
    ar = ar_variant(dep, stock, cache)
    if dep.controller.prompts == "composed" and held_out.load(dep, home) is None:
        progress("composing the judged prompts")
        composed.make(dep, home)  # a fresh pool for this Phase 0 and the comparisons after it
    reqs, draw = draw_requests(dep, home)
    run_id = records.add_run(db, dep.name, "phase0", stock.tree, ar.tree)
    raw = home.runs / f"{run_id}"
    progress("stock and AR on every request")
    try:
        with lease(home, slots_of(dep), timed=True) as slots:
            if len(slots) >= 2:  # side by side; on one slot, taking turns
                where, schedule = {"stock": slots[0], "ar": slots[1]}, [{"stock": reqs, "ar": reqs}]
            else:
                where, schedule = {"stock": slots[0], "ar": slots[0]}, [{"stock": reqs}, {"ar": reqs}]
            period = run_period(
                adapter_for(dep, home), {"stock": stock, "ar": ar}, where, schedule, raw, "phase0"
            )
    except SystemFailed as e:
        records.fail_run(db, run_id, f"{e}\n{e.log_tail}")
        raise SpecPilotError(f"Phase 0 failed: {e} (logs in {raw})") from None
    except SpecPilotError as e:  # refused before it ran (a GPU another process computes on)
        records.fail_run(db, run_id, str(e))
        raise
    # A batch deployment's groups: stock over AR at each batch size, then scored request by request.
    by_batch = {str(g.batch): period.results["stock"][g.id].speed / period.results["ar"][g.id].speed
                for g in reqs if isinstance(g, Group)}  # fmt: skip
    outs = {
        lb: flatten(reqs, {r.id: res[r.id].tokens for r in reqs})[1] for lb, res in period.results.items()
    }
    reqs = flatten(reqs)[0]
    progress("scoring stock and AR by token forcing")
    divergences = []
    with scorer_for(dep, home) as scorer:
        for r in reqs:
            s, a = outs["stock"][r.id], outs["ar"][r.id]
            i = first_divergence(s, a)
            if i is not None:
                gap = scorer.logprob_gap(r.input_ids, s[:i], s[i], a[i])
                divergences.append({"id": r.id, "position": i, "stock": s[i], "ar": a[i], "margin": gap})
        stock_scored = [scorer.score(r.id, r.input_ids, outs["stock"][r.id]) for r in reqs]
        ar_scored = [scorer.score(r.id, r.input_ids, outs["ar"][r.id]) for r in reqs]
    delta = calibrate_delta([d["margin"] for d in divergences])
    scored_path = home.runs / f"{run_id}-stock-scored.json"
    scored_path.write_text(json.dumps([asdict(s) for s in stock_scored]))
    own = audit(stock_scored, stock_scored, delta)
    ar_own = audit(ar_scored, ar_scored, delta)
    figures = {
        "run_id": run_id, "stock_tree": stock.tree, "delta": delta, "divergences": divergences,
        "requests": len(reqs), "stock_scored": str(scored_path), "draw": draw,
        "stock": {"positions": own.positions, "mismatches": own.mismatches, "rate": own.rate,
                  "large": own.stock_events},
        "ar": {"positions": ar_own.positions, "mismatches": ar_own.mismatches, "rate": ar_own.rate,
               "large": ar_own.stock_events},
        "stock_equals_ar": sum(outs["stock"][r.id] == outs["ar"][r.id] for r in reqs),
    }  # fmt: skip
    if by_batch:
        figures["stock_over_ar_by_batch"] = by_batch
    records.finish_run(db, run_id, summary=figures, raw_path=str(raw))
    records.set_state(db, dep.name, "phase0", figures)
    records.set_state(db, dep.name, "controller_digest", judge_digest(dep, home))
    progress("stock noise (A/A)")
    figures["noise"] = measure_noise(dep, home, blocks=blocks, progress=progress)
    return figures
