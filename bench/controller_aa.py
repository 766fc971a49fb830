"""The controller against itself, and against a calibrated gain: approvals, bounds, time to a verdict.

    python bench/controller_aa.py --deployment smollm-cpu --comparisons 20 [--home DIR] [--json OUT]
    python bench/controller_aa.py --deployment smollm-cpu --comparisons 10 --gain 0.03 ...

A/A (default): each comparison is a full `controller.compare` (sequential blocks, audit, stored
verdict) of stock against a copy of stock that differs by one comment line — the same system under
another tree hash. `--gain G`: the baseline is stock with a CPU burn in every decode step worth a
fraction G of stock's own step time (measured on this machine first), so stock is a true 1 + G
faster candidate: a calibrated gain. The burn spins on the thread's own CPU clock, so it costs the
same in every design (a sleep would run on while a sliced system is frozen). Phase 0 runs first
if the home has none.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from specpilot import controller
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store import connect, records
from specpilot.memory_store.workspace import Workspace

STEP = '        if mode == "spec":\n            return self.step('


def step_seconds(dep, home) -> float:
    """Stock's decode step time on this machine, from its Phase 0 run's raw timings, as the gain
    measure sees it: the controller's gain is the geometric mean over requests of each request's
    speed ratio, so a burn of d per step slows request i by d·steps_i/T_i and the right d for a
    gain G is G / mean_i(steps_i/T_i) (a ratio of sums, prefill included, gave 2.4% for 3%)."""
    db = connect(home)
    runs = [r for r in records.list_runs(db, dep.name) if r.kind == "noise" and r.status == "done"]
    raw = Path(runs[-1].raw_path)
    lines = [json.loads(x) for x in raw.read_text().splitlines()]
    rows = [r for r in lines if r.get("system") == "A" and not r.get("warmup")]
    rates = [r["claims"]["steps"] / (r["t_done"] - r["t_send"] if r.get("active_s") is None else r["active_s"])
             for r in rows]  # fmt: skip
    return 1 / statistics.mean(rates)


def aa_copy(ws: Workspace) -> str:
    """The branch of a copy of stock that differs by one comment line (made once): the same
    system under another tree hash."""
    if "cand/aa-copy" not in ws.branches():
        wt = ws.add_worktree("aa-copy", "stock")
        gen = wt / "refspec" / "generate.py"
        gen.write_text(gen.read_text() + "\n# A/A copy: the same system under another tree hash.\n")
        ws.commit_worktree(wt, "A/A copy of stock")
    return "cand/aa-copy"


def slowed(ws: Workspace, dep, home, gain: float) -> str:
    """The branch of stock with a CPU burn in every decode step worth `gain` of stock's step on
    this machine (made once per size): stock is then a true 1 + gain faster candidate."""
    delay = step_seconds(dep, home) * gain
    name = f"slow-{round(gain * 1000)}-{round(delay * 1e6)}us"
    if f"cand/{name}" not in ws.branches():
        wt = ws.add_worktree(name, "stock")
        gen = wt / "refspec" / "generate.py"
        if STEP not in gen.read_text():
            raise SystemExit("controller_aa: stock's decode step moved; update STEP to where the burn goes")
        burn = (f"        _t = __import__('time'); _end = _t.thread_time() + {delay:.6f}\n"
                "        while _t.thread_time() < _end: pass\n")  # fmt: skip
        gen.write_text(gen.read_text().replace(STEP, burn + STEP, 1))
        ws.commit_worktree(wt, f"stock slowed by {gain:.0%} of a step (CPU burn {delay * 1e3:.2f} ms)")
    return f"cand/{name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--comparisons", type=int, default=20)
    ap.add_argument("--gain", type=float, default=0.0, help="a calibrated true gain (0.03 = 3%%); 0: A/A")
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    home = Home.resolve(args.home)
    dep = load_deployment(args.deployment, home)
    ws, _ = Workspace.init(home, dep)
    db = connect(home)
    if records.get_state(db, dep.name, "phase0") is None:
        t = time.monotonic()
        controller.run_phase0(dep, home)
        print(f"Phase 0: {time.monotonic() - t:.0f}s")
    if args.gain:
        baseline, candidate = slowed(ws, dep, home, args.gain), "stock"
    else:
        baseline, candidate = "stock", aa_copy(ws)
    rows = []
    for i in range(args.comparisons):
        t = time.monotonic()
        ev = controller.compare(dep, home, baseline, candidate)
        rows.append({"gain": ev.gain, "lower_bound": ev.lower_bound, "approved": ev.approved,
                     "threshold": ev.threshold, "sigma": ev.sigma, "seconds": time.monotonic() - t,
                     "blocks": ev.evidence.get("n"), "set_aside": ev.evidence.get("set_aside"),
                     "decided_s": (ev.evidence.get("rounds_s") or [[None]])[-1][0],
                     "verdict": ev.id, "reasons": ev.reasons})  # fmt: skip
        print(f"{i + 1:3d}: gain {ev.gain:.4f} lower bound {ev.lower_bound:.4f} bar {ev.threshold:.2%} "
              f"{'APPROVED' if ev.approved else 'rejected'} ({rows[-1]['seconds']:.0f}s, {rows[-1]['blocks']} blocks) "
              f"{'; '.join(r for r in ev.reasons if not r.startswith('lower bound'))}", flush=True)  # fmt: skip
        noise = records.get_state(db, dep.name, "noise")
        summary = {
            "deployment": dep.name, "kind": f"calibrated {args.gain:.0%}" if args.gain else "A/A",
            "comparisons": len(rows), "approved": sum(r["approved"] for r in rows),
            "median_gain": statistics.median(r["gain"] for r in rows),
            "max_lower_bound": max(r["lower_bound"] for r in rows),
            "median_seconds_to_verdict": statistics.median(r["seconds"] for r in rows),
            "median_seconds_to_decision": statistics.median(r["decided_s"] or r["seconds"] for r in rows),
            "median_blocks": statistics.median(r["blocks"] or 0 for r in rows),
            "pooled_block_sd": noise["pooled_sd"], "aa_runs": len(noise["runs"]),
            "cpu": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows,
        }  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
