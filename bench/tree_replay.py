"""τ of tree vs chain verification by exact replay of a refspec recording (paper §4.2).

    python bench/tree_replay.py RECORD.jsonl [--blocks 8,16] [--budgets 8,16,32,64] [--json OUT]

RECORD.jsonl is a `python -m refspec.record` recording (CONTRACTS §4) made at the largest block
size wanted. The n-gram drafter's first m positions do not depend on how many it drafts, so a
recording at block size 16 replays block size 8 exactly by cutting each lattice to 8 positions.
Per block size and node budget: the stock chain, the best-first tree (parent-conditioned, as the
refspec-tree-verify entry builds it, and marginal), the EAGLE-2-style top-k tree, and the top-16
oracle, pooled over requests (tokens / steps); and the mean rows per step (root + nodes) of the
chain and the best-first tree along their replays.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from specpilot.costmodel import load_records, replay_table
from specpilot.costmodel.recording import Record
from specpilot.kernels.tree import Lattice, accept_length, best_first_tree, chain


def cut(records: list[Record], block: int) -> list[Record]:
    """The recording as if drafted with `block` positions per step."""
    out = []
    for r in records:
        if block > r.block_size:
            raise SystemExit(f"{r.id}: recorded at block size {r.block_size}, cannot replay {block}")
        lats = [Lattice(lat.tokens[:block], lat.logp[:block], lat.cond[:block]) for lat in r.lattices]
        out.append(dataclasses.replace(r, block_size=block, lattices=lats))
    return out


def rows_per_step(records: list[Record], policy: str, budget: int) -> float:
    """Mean verification rows per step (root + nodes) along the replay of a policy: the n-gram
    lattice is sparse, so a tree often holds fewer nodes than its budget."""
    rows = steps = 0
    for r in records:
        i = 0
        while i < len(r.greedy):
            lat = r.lattices[i]
            tree = (
                chain(lat, min(budget, r.block_size)) if policy == "chain" else best_first_tree(lat, budget)
            )
            target = r.greedy[i:]
            i += min(accept_length(tree, target) + 1, len(target))
            rows, steps = rows + len(tree) + 1, steps + 1
    return rows / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path)
    ap.add_argument("--blocks", default="8,16")
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--json", type=Path, default=None, help="write the tables as JSON here")
    args = ap.parse_args()
    records = load_records(args.record)
    budgets = [int(b) for b in args.budgets.split(",")]
    tables = {}
    print(f"{args.record}: {len(records)} requests, {sum(len(r.greedy) for r in records)} tokens")
    for block in (int(b) for b in args.blocks.split(",")):
        recs = cut(records, block)
        t = replay_table(recs, budgets).to_dict()
        t["rows_per_step"] = {
            p: {str(b): rows_per_step(recs, p, b) for b in budgets} for p in ("chain", "best_first")
        }
        tables[str(block)] = t
        print(f"\nblock size {block} (oracle {t['tau']['oracle']:.3f})")
        print(f"{'policy':<22}" + "".join(f"{b:>9}" for b in budgets))
        for policy in ("chain", "best_first", "best_first_marginal", "topk"):
            print(f"{policy:<22}" + "".join(f"{t['tau'][policy][str(b)]:>9.3f}" for b in budgets))
        for policy in ("chain", "best_first"):
            rows = t["rows_per_step"][policy]
            print(f"{'rows/step ' + policy:<22}" + "".join(f"{rows[str(b)]:>9.2f}" for b in budgets))
    if args.json:
        args.json.write_text(json.dumps(tables, indent=1) + "\n")


if __name__ == "__main__":
    main()
