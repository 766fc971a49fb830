"""Where the one-GPU design's noise comes from: A/A comparisons of stock against a copy of itself.

    python bench/gpu_noise.py --out DIR [--blocks 4] [--repeats 2] [--budget-s 300]

Run after `source bench/gpu_env.sh` on the lent H200 (as bench/gpu_round.py). Variants, in turn,
`--repeats` times each (so drift over the run falls on every variant alike): with the controller's
NVML watch, and without it (what the watch costs). Per comparison (fixed blocks, no audit): the
block gains, the spread of per-request log ratios, and the median step time (inter-arrival of a
system's token lines) of every turn. (At commit 503b529 a third variant put the GPU systems' host
side on a core of its own: no difference at this noise, so it was removed; docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {"watch": True, "no-watch": False}


def turns_of(raw: Path) -> dict:
    """Block log gains, per-request log ratios and each turn's median step time (ms) from a raw file."""
    rows = [json.loads(x) for x in raw.read_text().splitlines()]
    reqs = [r for r in rows if "system" in r and not r["warmup"]]
    out: dict = {"block_log_gains": [], "request_log_ratios": [], "turn_step_ms": []}
    for b in sorted({r["block"] for r in reqs}):
        by = {s: {r["id"]: r for r in reqs if r["block"] == b and r["system"] == s} for s in "AB"}
        logs = [math.log((by["A"][i]["t_done"] - by["A"][i]["t_send"]) / (by["B"][i]["t_done"] - by["B"][i]["t_send"]))
                for i in by["A"]]  # fmt: skip
        out["block_log_gains"].append(statistics.fmean(logs))
        out["request_log_ratios"] += logs
        ids = sorted(by["A"])
        half = (len(ids) + 1) // 2
        for s in "AB":
            for part in (ids[:half], ids[half:]):
                gaps = []
                for i in part:
                    t = [a[0] for a in by[s][i]["arrivals"]]
                    gaps += [y - x for x, y in zip(t, t[1:], strict=False)]
                if gaps:
                    out["turn_step_ms"].append(round(1e3 * statistics.median(gaps), 4))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=300)
    args = ap.parse_args()
    t0 = time.monotonic()

    from gpu_round import DEP, aa_copy

    from specpilot import controller
    from specpilot.controller import paired
    from specpilot.deployments import Home, load_deployment

    home = Home.resolve()
    dep = load_deployment(DEP, home)
    cand = aa_copy(dep, home)
    watch = paired.watch_for
    res: dict = {"blocks": args.blocks, "runs": []}
    for rep in range(args.repeats):
        for name, watched in VARIANTS.items():
            if time.monotonic() - t0 > args.budget_s:
                break
            paired.watch_for = watch if watched else (lambda _slot: None)
            t = time.monotonic()
            ev = controller.compare(dep, home, "stock", cand, blocks=args.blocks, audit_output=False)
            raw = Path(ev.evidence["raw"])
            row = {"variant": name, "repeat": rep, "gain": ev.gain, "lower_bound": ev.lower_bound,
                   "seconds": time.monotonic() - t,
                   "reasons": ev.reasons} | turns_of(raw)  # fmt: skip
            sd = statistics.stdev(row["block_log_gains"]) if len(row["block_log_gains"]) > 1 else None
            steps = row["turn_step_ms"]
            row |= {"block_sd": sd, "request_sd": statistics.stdev(row["request_log_ratios"]),
                    "turn_step_spread": max(steps) / min(steps) - 1}  # fmt: skip
            res["runs"].append(row)
            print(f"{name:20s} rep {rep}: gain {ev.gain:.4f} block sd {sd:.4f} request sd {row['request_sd']:.4f} "
                  f"turn steps {min(steps):.3f}-{max(steps):.3f} ms  {row['seconds']:.0f}s", flush=True)  # fmt: skip
            (args.out / "gpu_noise.json").write_text(json.dumps(res, indent=1))
    paired.watch_for = watch


if __name__ == "__main__":
    main()
