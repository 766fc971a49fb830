"""Helpers for the SGLang tests: a tree whose `sglang.launch_server` is the protocol fake, and specs.

The fake (`fake_sglang_server.py`) stands in for a GPU server only; everything the controller does
around it — launching, health, streaming, timing, stopping, scoring — is the real code.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from specpilot.deployments import Home
from specpilot.deployments.stock.wheel import LAUNCH_FILE, LAUNCH_TEMPLATE

FAKE = Path(__file__).with_name("fake_sglang_server.py")
FAKE_PIN = "sglang==0.0.0+fake"
V = 49152


def make_fake_tree(root: Path, **behaviour) -> Path:
    """A system tree laid out like SGLang's stock tree, with the fake as its launch_server."""
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(FAKE, pkg / "launch_server.py")
    (pkg / "fake.json").write_text(json.dumps({"step_ms": 5, "load_s": 0.1} | behaviour, indent=1) + "\n")
    (root / LAUNCH_FILE).write_text(LAUNCH_TEMPLATE)
    return root


def fake_argmax(ctx: list[int]) -> int:
    """The fake model's greedy token after `ctx` (an independent copy of its rule)."""
    return (31 * ctx[-1] + 7 * len(ctx)) % V


def fake_greedy(prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(fake_argmax(ctx))
    return ctx[len(prompt) :]


def fake_logprob(ctx: list[int], token: int) -> float:
    best = fake_argmax(ctx)
    return math.log(0.9 if token == best else 0.09 if token == (best + 1) % V else 0.01 / (V - 2))


def spec_text(name: str, *, model: str = "fake/target", sets: str = "{ mine = 4 }", max_new_tokens: int = 32,
              blocks: int = 3, slots: str = '["cpu:0", "cpu:1"]', block_size: int = 4) -> str:  # fmt: skip
    """A deployment of the sglang engine on CPU slots, its stock the fake's pin, judged in the GPU
    designs (swapped on two slots, interleaved on one), as a real SGLang server on GPUs would be:
    the fake paces its steps with sleeps, which a sliced design would not charge it for."""
    design = "swapped" if "," in slots else "interleaved"
    return f"""\
name = "{name}"
description = "SGLang adapter test deployment (protocol fake)"
engine = "sglang"

[stock]
wheel = "{FAKE_PIN}"

[target]
model = "{model}"
dtype = "bfloat16"

[target.arch]
layers = 30
hidden = 576
intermediate = 1536
heads = 9
kv_heads = 3
head_dim = 64
vocab = {V}

[drafter]
kind = "dflash2"
model = "fake/drafter"
block_size = {block_size}

[devices]
kind = "cpu"
slots = {slots}

[workload]
sets = {sets}
max_new_tokens = {max_new_tokens}

[controller]
blocks = {blocks}
budget_s = 60
max_blocks = 6
warmup_requests = 1
design = "{design}"
"""


def write_spec(home: Home, name: str, **kw) -> None:
    home.deployments.mkdir(parents=True, exist_ok=True)
    (home.deployments / f"{name}.toml").write_text(spec_text(name, **kw))
