"""Split a paired run's per-request speed noise into its parts, from the controller's raw files.

    python bench/noise_residuals.py RUN.jsonl [RUN.jsonl ...]

Per measured request: log output speed minus that request's mean and its slot's mean (what is
left is noise). Printed: the residual sd of one system's request, its sd inside one process, the
sd of process means against what independent requests would give (above it: the process, or the
stretch of time it ran in, has a speed of its own), the lag-1 autocorrelation of a process's
consecutive requests, and the correlation of A's and B's residuals on the same request of the same
period (what pairing the two systems in time can cancel).
"""

from __future__ import annotations

import json
import math
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path


def main(paths: list[str]) -> None:
    rows = [json.loads(line) for p in paths for line in Path(p).read_text().splitlines()]
    rows = [r for r in rows if "id" in r and not r["warmup"]]
    for r in rows:
        r["ls"] = math.log(len(r["tokens"]) / (r["t_done"] - r["t_send"]))
    by_req, by_slot = defaultdict(list), defaultdict(list)
    for r in rows:
        by_req[r["id"]].append(r["ls"])
    for r in rows:
        r["res"] = r["ls"] - st.mean(by_req[r["id"]])
        by_slot[r["slot"]].append(r["res"])
    for r in rows:
        r["res"] -= st.mean(by_slot[r["slot"]])
    streams = defaultdict(list)
    for r in rows:
        streams[(r["block"], r["period"], r["system"], r["slot"], r["tree"])].append(r)
    means, lag, within = [], [], []
    for v in streams.values():
        x = [r["res"] for r in sorted(v, key=lambda r: r["t_send"])]
        m = st.mean(x)
        means.append(m)
        within.append(st.variance(x))
        lag += [(a - m) * (b - m) for a, b in zip(x[:-1], x[1:], strict=True)]
    var_w, n = st.mean(within), st.mean(len(v) for v in streams.values())
    pairs = defaultdict(dict)
    for r in rows:
        pairs[(r["block"], r["period"], r["id"])][r["system"]] = r["res"]
    ab = [(v["A"], v["B"]) for v in pairs.values() if len(v) == 2]
    a, b = [x for x, _ in ab], [y for _, y in ab]
    corr = st.mean((x - st.mean(a)) * (y - st.mean(b)) for x, y in ab) / (st.pstdev(a) * st.pstdev(b))
    print(json.dumps({
        "single_system_sd": st.stdev(r["res"] for r in rows),
        "within_process_sd": math.sqrt(var_w),
        "process_mean_sd": st.stdev(means),
        "process_mean_sd_if_independent": math.sqrt(var_w / n),
        "lag1_autocorr": st.mean(lag) / var_w,
        "corr_A_B_same_request": corr,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
