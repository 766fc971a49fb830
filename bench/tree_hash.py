"""Storing a stock tree's blobs in a fresh scratch repository: loose objects vs one pack.

    python bench/tree_hash.py [--deployment qwen27b-h100] [--repeat 3]

`memory_store.gittree.write_tree` hashes a stock tree into the scratch repository of every
memory operation (add, replay, seal-check). SGLang's stock tree has 4,604 files (90 MB); this times
`git hash-object -w --stdin-paths` (one loose object per file, the old way) against
`write_blobs` (hash, then `git fast-import` of the missing blobs into one pack), alternating,
each in a new bare repository. Wall and CPU seconds (this process and its children).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from specpilot.deployments import Home, load_deployment
from specpilot.memory_store.gittree import source_files, write_blobs
from specpilot.memory_store.stock import stock_for


def _cpu() -> float:
    r, s = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + s.ru_utime + s.ru_stime


def _loose(repo: Path, paths: list[Path]) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--no-filters", "--stdin-paths"],
                         input="\n".join(map(str, paths)), capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="qwen27b-h100")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    stock = stock_for(load_deployment(args.deployment), Home.resolve()).path
    paths = [stock / f for f in source_files(stock)]
    print(f"{stock}: {len(paths)} files, {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB")
    times: dict[str, list[tuple[float, float]]] = {"loose objects": [], "one pack": []}
    for _ in range(args.repeat):
        for name, store in (("loose objects", _loose), ("one pack", write_blobs)):
            with tempfile.TemporaryDirectory() as tmp:
                repo = Path(tmp) / "r.git"
                subprocess.run(["git", "init", "-q", "--bare", str(repo)], check=True)
                t, c = time.perf_counter(), _cpu()
                shas = store(repo, paths)
                times[name].append((time.perf_counter() - t, _cpu() - c))
                assert len(shas) == len(paths)
    for name, runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"{name:14s} wall median {statistics.median(walls):6.2f} s  cpu median {statistics.median(cpus):6.2f} s"
              f"  (wall {', '.join(f'{w:.2f}' for w in walls)})")  # fmt: skip


if __name__ == "__main__":
    main()
