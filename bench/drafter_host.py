"""Host µs per spec step in refspec's n-gram drafter: the whole lattice against stock's chain-only draft.

    python bench/drafter_host.py [--deployment smollm-h200] [--requests 12] [--repeats 20] [--before REV] [--json OUT]

The drafter runs on the host between two verification passes, so on a device-bound step it is on
the critical path (issue 40: a spec step's host time). Each request of the deployment's workload is
decoded greedily (refspec AR on a CPU slot, max_new_tokens each) once; the spec steps are then
replayed on the host alone: draft, verify as the greedy output does (accept the chain's longest
matching prefix plus the bonus token), commit. Both drafts run at every step of the same replay,
alternating which goes first, and each is timed with perf_counter; extend (the index update) is
timed apart. --before REV also times the drafter of git revision REV (its whole lattice, a module
loaded from `git show`) at the same steps. Results go into docs/BENCHMARKS.md by hand, with the command, machine and date.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from refspec_speed import machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", default="smollm-h200", help="whose workload and decode knobs")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=20, help="replays of every request")
    parser.add_argument("--before", default=None, help="a git revision whose drafter.py is timed too")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.stock import import_refspec
    from specpilot.deployments.workloads import load_requests, request_file

    import_refspec()
    from refspec.config import load_config
    from refspec.drafter import NgramDrafter
    from refspec.runtime import open_engine
    from refspec.weights import SMOLLM2

    dep = load_deployment(args.deployment)
    requests = load_requests(request_file(dep, Home.resolve()))[: args.requests]
    config = load_config()
    m, k = config.decode.block_size, config.decode.top_k
    engine = open_engine("cpu:0", SMOLLM2, None, config)
    new = dep.workload.max_new_tokens
    greedy = []
    for r in requests:
        out = []
        for chunk in engine.generate(r.input_ids, new, "ar"):
            out.extend(chunk)
        greedy.append(out)

    drafts = {"lattice": lambda d: d.draft(m, k), "chain_only": lambda d: d.draft(m, 1, cond=False)}
    old = None
    if args.before:
        old = _drafter_at(args.before)
        drafts["lattice_before"] = lambda d: d.old.draft(m, k)
    us: dict[str, list[float]] = {name: [] for name in (*drafts, "extend")}
    steps = tokens = 0
    for rep in range(args.repeats):
        order = list(drafts) if rep % 2 == 0 else list(drafts)[::-1]
        for r, out in zip(requests, greedy, strict=True):
            drafter = NgramDrafter(config.drafter.max_ngram, config.drafter.min_ngram)
            drafter.reset(list(r.input_ids))
            if old:
                drafter.old = old.NgramDrafter(config.drafter.max_ngram, config.drafter.min_ngram)
                drafter.old.reset(list(r.input_ids))
            i = 0
            while i < new:
                chains = {}
                for name in order:
                    t = time.perf_counter()
                    chains[name] = drafts[name](drafter).chain()
                    us[name].append((time.perf_counter() - t) * 1e6)
                if len({tuple(ch) for ch in chains.values()}) > 1:
                    raise SystemExit(f"request {r.id}: the drafts' chains differ: {chains}")
                chain = chains["lattice"][: max(new - i - 1, 0)]
                acc = 0
                while acc < len(chain) and chain[acc] == out[i + acc]:
                    acc += 1
                committed = out[i : i + acc + 1]
                t = time.perf_counter()
                drafter.extend(committed)
                if old:
                    drafter.old.extend(committed)
                us["extend"].append((time.perf_counter() - t) * 1e6)
                i += len(committed)
                if rep == 0:
                    steps, tokens = steps + 1, tokens + len(committed)

    engine_us = engine_host_us(requests, greedy, config, args.repeats)
    result = {
        "machine": machine("cpu:0"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "before": args.before,
        "deployment": args.deployment,
        "requests": len(requests),
        "max_new_tokens": new,
        "block_size": m,
        "top_k": k,
        "steps": steps,
        "tau": tokens / steps,
        "load_average": os.getloadavg()[0],
        "us_per_step": {
            name: {"median": statistics.median(v), "mean": statistics.fmean(v)} for name, v in us.items()
        },
        "engine_host_us_per_step": engine_us,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


class GreedyTarget:
    """A target whose pass costs nothing: each row's argmax is the greedy output after its position,
    which is what the real target gives every row the chain policy reads (the rows up to the first
    mismatch, and the bonus row). With it `Engine` runs its host work alone: drafting, the policy,
    acceptance, bookkeeping — what a device-bound step waits on the host for, minus the model's own
    launch and copy code."""

    def __init__(self, vocab: int):
        import torch

        self.device = torch.device("cpu")
        self.args = type("Args", (), {"vocab": vocab})()
        self.seq: list[int] = []

    def setup_cache(self, batch: int, slots: int) -> None:
        pass

    def prefill(self, tokens: list[int], start: int) -> None:
        pass

    def verify(self, tokens, positions, start, mask, head=None) -> list[int]:
        return [self.seq[p + 1] for p in positions]


def engine_host_us(requests, greedy, config, repeats: int) -> dict:
    """Engine.generate's wall time a step with GreedyTarget, spec and AR, mean over the requests."""
    from refspec.generate import Engine

    target = GreedyTarget(1 << 20)
    engine = Engine(target, config)
    out = {}
    for mode in ("spec", "ar"):
        wall, steps = 0.0, 0
        for _ in range(repeats):
            for r, want in zip(requests, greedy, strict=True):
                target.seq = [*r.input_ids, *want]
                got = []
                t = time.perf_counter()
                for chunk in engine.generate(r.input_ids, len(want), mode):
                    got.extend(chunk)
                wall += time.perf_counter() - t
                steps += engine.stats.steps
                if got != want:
                    raise SystemExit(
                        f"request {r.id}: {mode} with the greedy target is not the greedy output"
                    )
        out[mode] = wall / steps * 1e6
    return out


def _drafter_at(rev: str):
    """refspec/drafter.py as of git revision rev, imported as its own module."""
    path = "deployments/stock/refspec/refspec/drafter.py"
    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True, check=True
    )
    spec = importlib.util.spec_from_loader(f"drafter_{rev}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(src.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module


if __name__ == "__main__":
    main()
