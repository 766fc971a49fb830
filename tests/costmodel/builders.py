"""Hand-built recordings with hand-computed τ, and step profiles, for the cost-model tests."""

from __future__ import annotations

import json
from pathlib import Path

X, Y, Z = 1, 2, 3  # wrong candidates: never in the greedy streams below
PAD = 999  # a lattice entry past the end of the greedy stream
GREEDY = list(range(100, 112))  # 12 tokens


def step_lattice(g: list[int], i: int) -> dict:
    """The lattice at greedy position i, the same shape at every i (JSON form, block 3).

    Marginal scores put the wrong Y first at position 1; cond knows that g[i+1] follows g[i]:

        position 0: g0 -0.2, X -2.5
        position 1: Y -0.3, g1 -1.5        cond[1][g0] = g1 -0.05, Y -3.0
        position 2: g2 -0.4, Z -1.1        cond[2][g1] = g2 -0.05

    Path scores, marginal: g0 -0.2, g0 Y -0.5, g0 Y g2 -0.9, g0 Y Z -1.6, g0 g1 -1.7, g0 g1 g2 -2.1,
    X -2.5. Conditioned: g0 -0.2, g0 g1 -0.25, g0 g1 g2 -0.3, X -2.5, X Y -2.8, g0 Y -3.2.
    """
    g0, g1, g2 = (g[j] if j < len(g) else PAD for j in (i, i + 1, i + 2))
    return {
        "tokens": [[g0, X], [Y, g1], [g2, Z]],
        "logp": [[-0.2, -2.5], [-0.3, -1.5], [-0.4, -1.1]],
        "cond": [{}, {str(g0): [[g1, -0.05], [Y, -3.0]]}, {str(g1): [[g2, -0.05]]}],
    }


def record(rid: str, greedy: list[int], lattices: list[dict], block: int = 3) -> dict:
    return {
        "id": rid,
        "prompt_len": 7,
        "block_size": block,
        "top_k": 16,
        "drafter": "ngram",
        "greedy": greedy,
        "lattices": lattices,
    }


def humaneval_record() -> dict:
    return record("humaneval-0", GREEDY, [step_lattice(GREEDY, i) for i in range(len(GREEDY))])


def mtbench_record() -> dict:
    """No n-gram ever matches: every step is an AR step (τ = 1) under every policy."""
    greedy = [200, 201, 202, 203, 204]
    return record("mtbench-0", greedy, [{"tokens": [], "logp": [], "cond": []} for _ in greedy])


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def profile_dict(**over) -> dict:
    """A CONTRACTS §5 step profile; class times in seconds."""
    classes = over.pop(
        "classes", {"linear": 0.020, "attention": 0.004, "lm_head": 0.003, "drafter": 0.002, "other": 0.001}
    )
    base = {
        "engine": "refspec",
        "device": "cuda:0",
        "dtype": "bfloat16",
        "mode": "spec",
        "block_size": 8,
        "rows_per_step": 9.0,
        "steps": 100,
        "tau": 4.25,
        "step_wall_s": 0.036,
        "ar_step_wall_s": 0.024,
        "context_len": 2000.0,
        "classes": classes,
        "profiled_s": sum(classes.values()),
    }
    return {**base, **over}
