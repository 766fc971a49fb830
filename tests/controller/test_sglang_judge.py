"""Phase 0, paired comparisons and token-forcing audits of SGLang systems, unchanged controller.

A real SGLang server needs a GPU, which CI does not have: this edge cannot run here. The stock
tree of this deployment is registered through the memory store's wheel-stock seam as a tree whose
`sglang.launch_server` is the protocol fake (`fake_sglang_server.py`, SGLang 0.5.20's /health,
streaming /generate and input-logprob format); everything around it is the real controller: the
SGLang adapter and scorer, leases on two CPU slots, paired slot-swapped runs, Phase 0, the audit.
The fake's decode steps sleep, so its speed is set by its block size, not by the shared CPU.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from specpilot import controller
from specpilot.controller.scorer import scorer_for
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.knobs import set_knob
from specpilot.deployments.stock import import_refspec
from specpilot.deployments.stock.wheel import LAUNCH_FILE
from specpilot.memory_store import stock as stock_mod
from specpilot.memory_store.workspace import Workspace
from tests.conftest import phase0

from .sglang_fakes import FAKE_PIN, fake_argmax, fake_logprob, make_fake_tree, write_spec

pytestmark = [
    pytest.mark.quiet,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="paired runs need two CPU cores"),
]
NAME = "fake-sglang-judge"
PROMPTS = ["Write a haiku about GPUs.", "What is 17 * 23?", "Name three prime numbers.", "Say hello."]


def _materialize(wheel: str, folder: Path) -> None:
    assert wheel == FAKE_PIN
    make_fake_tree(folder, step_ms=20, load_s=0.1)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """(home, deployment, workspace, Phase 0 figures) on a cache of this module's own."""
    shared_cache = Path(os.environ["SPECPILOT_CACHE"])
    import_refspec()
    weights = importlib.import_module("refspec.weights")
    tokenizer_folder = weights.resolve_model("smollm2-135m-instruct", shared_cache)  # tokenizer + template
    root = tmp_path_factory.mktemp("sglang-judge")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPILOT_CACHE", str(root / "cache"))  # the fake stock never reaches the shared cache
        mp.setitem(stock_mod._materializers, "sglang", _materialize)
        home = Home(root / "home")
        (home.root / "datasets").mkdir(parents=True)
        (home.root / "datasets" / "mine.jsonl").write_text(
            "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
        )
        write_spec(home, NAME, model=str(tokenizer_folder), sets="{ mine = 4 }", max_new_tokens=32, blocks=3)
        dep = load_deployment(NAME, home)
        ws, _ = Workspace.init(home, dep)
        figures = phase0(dep, home)  # its noise run tried again if host steal disturbed it
        yield home, dep, ws, figures


def _candidate(ws: Workspace, name: str, edit) -> str:
    wt = ws.add_worktree(name)
    edit(wt)
    ws.commit_worktree(wt, name)
    return f"cand/{name}"


def _behaviour(**changes):
    def edit(tree: Path) -> None:
        path = tree / "python" / "sglang" / "fake.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=1) + "\n")

    return edit


def test_phase0_runs_stock_against_ar_and_scores_through_sglang(judged):
    home, dep, _, figures = judged
    assert figures["stock_equals_ar"] == 4 and figures["divergences"] == [] and figures["delta"] == 0.125
    assert figures["stock"] == {"positions": 4 * 32, "mismatches": 0, "rate": 0.0, "large": 0}
    assert 0.0 <= figures["noise"]["sigma"] < 0.5
    logs = home.runs / figures["run_id"]
    stock_log = (logs / "phase0-stock-cpu0.log").read_text()
    ar_log = next(logs.glob("phase0-ar-*.log")).read_text()
    assert "--speculative-algorithm DFLASH" in stock_log and "--speculative" not in ar_log
    scorer_log = next((home.runs / "scorer").glob(f"{NAME}-*.log")).read_text()
    assert "--enable-fp32-lm-head" in scorer_log and "--disable-radix-cache" in scorer_log


def test_sglang_scorer_margins_and_gaps(judged):
    """The scorer's reading of SGLang's input logprobs: argmax and margin at every output token."""
    home, dep, _, _ = judged
    prompt = [11, 2045, 7, 31000]
    output, ctx = [], list(prompt)
    for i in range(12):  # greedy, but the 4th token is the runner-up and the 9th an unlikely one
        t = fake_argmax(ctx)
        t = (t + 1) % 49152 if i == 3 else 5 if i == 8 else t
        output.append(t)
        ctx.append(t)
    with scorer_for(dep, home) as scorer:
        scored = scorer.score("x", prompt, output)
        gap = scorer.logprob_gap(prompt, output[:3], output[3], fake_argmax(prompt + output[:3]))
    want_argmax = [fake_argmax(prompt + output[:i]) for i in range(12)]
    assert scored.argmax == want_argmax and scored.mismatches() == [3, 8]
    for i, m in enumerate(scored.margins):
        ctx = prompt + output[:i]
        assert m == pytest.approx(fake_logprob(ctx, want_argmax[i]) - fake_logprob(ctx, output[i]), abs=1e-9)
    assert gap == pytest.approx(
        abs(fake_logprob(prompt + output[:3], output[3]) - fake_logprob(prompt + output[:3], want_argmax[3]))
    )


def test_a_bigger_block_from_the_launch_file_is_approved(judged):
    home, dep, ws, _ = judged
    cand = _candidate(
        ws, "block12", lambda t: set_knob(t / LAUNCH_FILE, "server.speculative-dflash-block-size", 12)
    )
    ev = controller.compare(dep, home, "stock", cand)
    assert ev.approved, ev.reasons
    assert ev.gain > 1.3 and not ev.changes_output and ev.evidence["audit"]["passed"]


def test_planted_defect_is_rejected_by_the_audit(judged):
    home, dep, ws, _ = judged
    ev = controller.compare(dep, home, "stock", _candidate(ws, "defect", _behaviour(defect_every=6)))
    assert not ev.approved and ev.changes_output
    assert any("audit:" in r for r in ev.reasons) and ev.evidence["audit"]["unexplained"] > 0


def test_crashing_candidate_is_a_failed_run_verdict(judged):
    home, dep, ws, _ = judged
    ev = controller.compare(dep, home, "stock", _candidate(ws, "crash", _behaviour(crash_after_chunks=2)))
    assert not ev.approved
    assert len(ev.reasons) == 1 and ev.reasons[0].startswith(
        "a system failed during the paired run: system exited with code 3 while serving request r0"
    )
    assert "fake-sglang: flags" in ev.evidence["log_tail"]


def test_the_gpu_smoke_script_runs_its_steps(tmp_path):
    """bench/sglang_smoke.sh end to end through the CLI, on CPU slots against the fake server."""
    import subprocess
    import sys

    shared_cache = Path(os.environ["SPECPILOT_CACHE"])
    import_refspec()
    tokenizer_folder = importlib.import_module("refspec.weights").resolve_model(
        "smollm2-135m-instruct", shared_cache
    )
    home, cache = Home(tmp_path / "home"), tmp_path / "cache"
    (home.root / "datasets").mkdir(parents=True)
    (home.root / "datasets" / "mine.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    )
    # Block 2 keeps the fake's speedup under the controller's 3x "implausibly large" guard.
    write_spec(home, "smoke", model=str(tokenizer_folder), sets="{ mine = 3 }", max_new_tokens=24, blocks=3,
               block_size=2)  # fmt: skip
    # The fake stock, materialized where the CLI's memory store looks for the spec's pinned wheel.
    make_fake_tree(cache / "stock" / "sglang" / "sglang-0.0.0-fake", step_ms=20, load_s=0.1)
    env = dict(os.environ, SPECPILOT_HOME=str(home.root), SPECPILOT_CACHE=str(cache),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    script = Path(__file__).resolve().parents[2] / "bench" / "sglang_smoke.sh"
    proc = subprocess.run(
        ["bash", str(script), "smoke", "3"], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = subprocess.run([str(Path(sys.executable).parent / "specpilot"), "--json", "report"], env=env,
                            capture_output=True, text=True, check=True)  # fmt: skip
    (verdict,) = json.loads(report.stdout)
    assert verdict["approved"] and 1.2 < verdict["gain"] < 3, verdict["reasons"]  # stock beats its own AR
    assert verdict["evidence"]["audit"]["passed"]
