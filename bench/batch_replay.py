"""Shared node budget vs equal per-request trees in a batch, by exact replay of a recording (paper §4.4).

    python bench/batch_replay.py RECORD.jsonl [--batches 2,4,8,16,32] [--nodes 4,8,16] [--json OUT]

RECORD.jsonl is a `python -m refspec.record` recording (CONTRACTS §4). Its requests are served in
batches of B consecutive requests that step together: each step, every unfinished request of the
batch verifies a tree over its lattice at its position and advances by its accepted length + the
bonus token. Equal: each request's own best-first tree of n nodes (the tree entry's rule). Shared:
the batch's n × (unfinished requests) nodes filled best-first across all of them
(`kernels.batching.shared_budget_trees`). τ per step = tokens / request-steps; rows = nodes + root
per request-step (the n-gram lattice is sparse, so equal trees often hold fewer than n nodes, and
the shared budget spends what they leave).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpilot.costmodel import load_records
from specpilot.kernels.batching import shared_budget_trees
from specpilot.kernels.tree import accept_length, best_first_tree, chain


def replay_batch(records, nodes: int, rule: str) -> tuple[int, int, int]:
    """(tokens, request-steps, rows) of one batch stepping together under a rule."""
    pos = [0] * len(records)
    tokens = request_steps = rows = 0
    while True:
        live = [i for i, r in enumerate(records) if pos[i] < len(r.greedy)]
        if not live:
            return tokens, request_steps, rows
        lats = [records[i].lattices[pos[i]] for i in live]
        if rule == "shared":
            trees = shared_budget_trees(lats, nodes * len(live))
        elif rule == "equal":
            trees = [best_first_tree(lat, nodes) for lat in lats]
        else:
            trees = [chain(lat) for lat in lats]
        for i, tree in zip(live, trees, strict=True):
            target = records[i].greedy[pos[i] :]
            step = min(accept_length(tree, target) + 1, len(target))
            pos[i] += step
            tokens += step
            rows += len(tree) + 1
        request_steps += len(live)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--batches", default="2,4,8,16,32")
    ap.add_argument("--nodes", default="4,8,16")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    records = load_records(args.record)
    out: dict = {"record": str(args.record), "requests": len(records), "rows": []}
    for b in (int(x) for x in args.batches.split(",")):
        groups = [records[i : i + b] for i in range(0, len(records) - b + 1, b)]  # whole batches only
        for n in (int(x) for x in args.nodes.split(",")):
            row: dict = {"batch": b, "nodes": n, "batches": len(groups)}
            for rule in ("chain", "equal", "shared"):
                t = s = r = 0
                for g in groups:
                    dt, ds, dr = replay_batch(g, n, rule)
                    t, s, r = t + dt, s + ds, r + dr
                row[rule] = {"tau": t / s, "rows_per_step": r / s}
            row["shared_tau_gain"] = row["shared"]["tau"] / row["equal"]["tau"]
            out["rows"].append(row)
            print(f"B={b:3d} n={n:3d}: chain {row['chain']['tau']:.3f}  equal {row['equal']['tau']:.3f} "
                  f"({row['equal']['rows_per_step']:.1f} rows)  shared {row['shared']['tau']:.3f} "
                  f"({row['shared']['rows_per_step']:.1f} rows)  gain {row['shared_tau_gain']:.3f}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
