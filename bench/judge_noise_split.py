"""Where a paired judge's noise comes from, read from its comparisons' raw request records.

    python bench/judge_noise_split.py RAW.jsonl... [--json OUT]
    python bench/judge_noise_split.py bench/results/gpu_judge_h200_raw.tgz [--json OUT]

For each comparison (one raw file of `controller.compare`, or every `*.jsonl` in a tarball): a
request's log ratio d = log(t_B / t_A) of its two timed runs in a block (time per new token), the
sd of d within a block, the block means' sd observed, and the sd that the requests alone would
give (within sd / sqrt(n)). Observed ≈ predicted means the blocks share no offset of their own: more
requests per block lower σ as 1 / sqrt(n). Also each block's wall time against its serving time
and the gap between blocks (fresh processes getting ready), which say what a request costs.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics as st
import tarfile
from collections import defaultdict
from pathlib import Path


def split(lines: list[str]) -> dict:
    recs = [json.loads(x) for x in lines if x.strip()]
    runs = [r for r in recs if "t_send" in r and "arrivals" in r]
    pairs: dict[tuple, dict[str, float]] = defaultdict(dict)
    by_block: dict[int, list[dict]] = defaultdict(list)
    for r in runs:
        by_block[r["block"]].append(r)
        if r.get("warmup"):
            continue
        n = sum(c for _, c in r["arrivals"])
        pairs[(r["block"], r["period"], r["id"])][r["system"]] = (r["t_done"] - r["t_send"]) / max(n, 1)
    d: dict[int, list[float]] = defaultdict(list)
    for (b, _, _), t in pairs.items():
        if "A" in t and "B" in t:
            d[b].append(math.log(t["B"] / t["A"]))
    blocks = sorted(d)
    means = [st.mean(d[b]) for b in blocks]
    within = st.mean(st.stdev(d[b]) for b in blocks) if blocks else float("nan")
    n = st.mean(len(d[b]) for b in blocks) if blocks else 0
    starts = [min(r["t_send"] for r in by_block[b]) for b in sorted(by_block)]
    ends = [max(r["t_done"] for r in by_block[b]) for b in sorted(by_block)]
    return {
        "blocks": len(blocks),
        "requests_per_block": n,
        "block_means": means,
        "request_sd": within,
        "block_sd_predicted": within / math.sqrt(n) if n else float("nan"),
        "block_sd_observed": st.stdev(means) if len(means) > 1 else None,
        "block_wall_s": st.mean(e - s for s, e in zip(starts, ends, strict=True)) if starts else None,
        "block_serve_s": st.mean(sum(r["t_done"] - r["t_send"] for r in by_block[b]) for b in sorted(by_block))
        if by_block else None,
        "gap_between_blocks_s": st.mean(starts[i + 1] - ends[i] for i in range(len(starts) - 1))
        if len(starts) > 1 else None,
    }  # fmt: skip


def sources(paths: list[Path]):
    for p in paths:
        if p.name.endswith((".tgz", ".tar.gz")):
            with tarfile.open(p) as tar:
                for m in sorted(tar.getmembers(), key=lambda m: m.name):
                    if m.isfile() and m.name.endswith(".jsonl"):
                        yield (
                            f"{p.name}:{Path(m.name).name}",
                            io.TextIOWrapper(tar.extractfile(m)).read().splitlines(),
                        )
        else:
            yield p.name, p.read_text().splitlines()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path, nargs="+")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = {}
    print(
        f"{'comparison':34} {'blocks':>6} {'n':>4} {'req sd':>7} {'pred':>6} {'obs':>6} {'wall':>6} {'serve':>6} {'gap':>6}"
    )
    for name, lines in sources(args.raw):
        r = rows[name] = split(lines)
        if not r["blocks"]:
            continue
        obs, gap = r["block_sd_observed"], r["gap_between_blocks_s"]
        print(f"{name:34} {r['blocks']:6d} {r['requests_per_block']:4.0f} {100 * r['request_sd']:6.2f}% "
              f"{100 * r['block_sd_predicted']:5.2f}% {'' if obs is None else f'{100 * obs:5.2f}%':>6} "
              f"{r['block_wall_s']:5.1f}s {r['block_serve_s']:5.1f}s "
              f"{'' if gap is None else f'{gap:5.1f}s':>6}")  # fmt: skip
    many = [r for r in rows.values() if r["block_sd_observed"] is not None]
    if many:
        pooled = lambda k: math.sqrt(st.mean(r[k] ** 2 for r in many))  # noqa: E731
        print(f"pooled over {len(many)}: request sd {100 * pooled('request_sd'):.2f}%, block sd predicted "
              f"{100 * pooled('block_sd_predicted'):.2f}%, observed {100 * pooled('block_sd_observed'):.2f}%")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
