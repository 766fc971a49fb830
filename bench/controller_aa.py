"""The controller against itself: stock vs stock, many times, must never be approved.

    python bench/controller_aa.py --deployment smollm-cpu --comparisons 20 [--home DIR]

Each comparison is a full `controller.compare` (paired, slot-swapped blocks, token-forcing audit,
stored verdict) of stock against a copy of stock that differs by one comment line — the same
system, with a different tree hash so the controller cannot tell. Reports the approval count, the
gains and bounds, the time to a verdict, and the power to detect a true 3% gain in this design,
computed from the measured spread (noncentral t). Phase 0 runs first if the home has none.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

from scipy import stats

from specpilot import controller
from specpilot.deployments import Home, load_deployment
from specpilot.memory_store import connect, records
from specpilot.orchestrator.workspace import Workspace


def power(true_gain: float, bar: float, log_sd: float, n: int) -> float:
    """P(one-sided 95% lower bound > 1 + bar) when the true gain is `true_gain` (noncentral t)."""
    if n < 2 or log_sd <= 0:
        return float("nan")
    se = log_sd / math.sqrt(n)
    crit = stats.t.ppf(0.95, n - 1)
    # LB > log(1+bar)  <=>  t = mean/se > crit + log(1+bar)/se
    nc = math.log(true_gain) / se
    return float(stats.nct.sf(crit + math.log1p(bar) / se, n - 1, nc))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--comparisons", type=int, default=20)
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
    if "cand/aa-copy" not in [h.name for h in ws.repo.heads]:
        wt = ws.add_worktree("aa-copy", "stock")
        gen = wt / "refspec" / "generate.py"
        gen.write_text(gen.read_text() + "\n# A/A copy: the same system under another tree hash.\n")
        ws.commit_worktree(wt, "A/A copy of stock")
    noise = records.get_state(db, dep.name, "noise")
    rows = []
    for i in range(args.comparisons):
        t = time.monotonic()
        ev = controller.compare(dep, home, "stock", "cand/aa-copy")
        rows.append({"gain": ev.gain, "lower_bound": ev.lower_bound, "approved": ev.approved,
                     "threshold": ev.threshold, "seconds": time.monotonic() - t, "unit": ev.unit,
                     "n": ev.evidence.get("n"), "log_sd": ev.evidence.get("log_sd"), "verdict": ev.verdict_id,
                     "measurement": [r for r in ev.reasons if r.startswith("measurement")],
                     "within_sd": math.sqrt(ev.evidence.get("within_var") or math.nan)})  # fmt: skip
        print(f"{i + 1:3d}: gain {ev.gain:.4f} lower bound {ev.lower_bound:.4f} bar {ev.threshold:.2%} "
              f"{'APPROVED' if ev.approved else 'rejected'} ({rows[-1]['seconds']:.0f}s) "
              f"{'; '.join(rows[-1]['measurement'])}")  # fmt: skip
    sd = statistics.median(r["log_sd"] for r in rows)
    n = rows[0]["n"]
    summary = {
        "deployment": dep.name, "comparisons": len(rows), "approved": sum(r["approved"] for r in rows),
        "no_verdict_measurement": sum(bool(r["measurement"]) for r in rows),
        "lower_bound_over_bar": sum(r["lower_bound"] > 1 + r["threshold"] for r in rows),
        "stock_within_sd": math.sqrt(noise.get("within_var", math.nan)),
        "sigma": noise["sigma"], "bar": rows[0]["threshold"], "unit": rows[0]["unit"], "n": n,
        "median_gain": statistics.median(r["gain"] for r in rows),
        "max_lower_bound": max(r["lower_bound"] for r in rows),
        "median_seconds_to_verdict": statistics.median(r["seconds"] for r in rows),
        "median_unit_log_sd": sd, "power_at_3pct": power(1.03, rows[0]["threshold"], sd, n),
        "power_at_5pct": power(1.05, rows[0]["threshold"], sd, n),
        "cpu": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows,
    }  # fmt: skip
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
