"""The token-forcing scorer in a worker process (controller/scorer_worker.py), as a GPU deployment's
audit and Phase 0 run it, here on a CPU slot: it answers as the in-process scorer does, holds its
slot's lease for exactly its life, and a worker that cannot load fails with one clear error.

Real SmolLM2 weights and tokenizer, a real subprocess and real slot leases; no timing.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specpilot.controller.scorer import RefspecScorer
from specpilot.controller.scorer_worker import WorkerScorer
from specpilot.controller.slots import Slot, lease
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.workloads import load_chat_template, target_folder
from tests.controller.confinement import left_behind, proc_state


@pytest.fixture
def smollm(home):
    h = Home.resolve(home)
    dep = load_deployment("smollm-cpu", h)
    tok = load_chat_template(target_folder(dep, h)).tokenizer
    prompt = tok.encode('def fib(n):\n    """The n-th Fibonacci number."""\n', add_special_tokens=False).ids
    output = tok.encode(
        "    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n", add_special_tokens=False
    ).ids
    return h, dep, prompt, output


def test_the_worker_answers_as_the_scorer_in_process_does(smollm):
    h, dep, prompt, output = smollm
    here = RefspecScorer(dep.target.model, h.cache)
    want = here.score("r0", prompt, output)
    assert any(m > 0 for m in want.margins) and any(m == 0 for m in want.margins)  # both kinds of position
    with WorkerScorer(dep, h, Slot("cpu", 0)) as worker:
        got = worker.score("r0", prompt, output)
        gap = worker.logprob_gap(prompt, output[:3], output[3], want.argmax[3])
        assert worker.score("r1", prompt, []).argmax == []
    assert (got.id, got.tokens, got.argmax) == ("r0", output, want.argmax)
    assert got.margins == pytest.approx(want.margins, abs=1e-4)
    assert gap == pytest.approx(here.logprob_gap(prompt, output[:3], output[3], want.argmax[3]), abs=1e-4)


def test_a_gpu_deployment_scores_in_a_worker_on_its_gpu_and_a_cpu_one_in_process(smollm):
    from specpilot.controller.scorer import scorer_for

    h, dep = smollm[:2]
    gpu = scorer_for(load_deployment("wide-h200", h), h)  # nothing starts before the first question
    assert isinstance(gpu, WorkerScorer) and str(gpu.slot) == "cuda:0" and gpu._proc is None
    assert isinstance(scorer_for(dep, h), RefspecScorer)


def test_the_worker_holds_its_slot_for_its_life_and_leaves_with_close(smollm):
    h, dep, prompt, output = smollm
    slot = Slot("cpu", 0)
    worker = WorkerScorer(dep, h, slot)
    with lease(h, [slot], timeout_s=5):  # nothing taken before the first question
        pass
    worker.score("r0", prompt, output[:4])
    proc = worker._proc
    with pytest.raises(SpecPilotError, match="stayed leased"), lease(h, [slot], timeout_s=0.3):
        pass
    worker.close()
    assert proc.poll() == 0  # it left on end of stdin
    with lease(h, [slot], timeout_s=5):
        pass


def test_a_worker_that_cannot_load_fails_once_clearly_and_frees_its_slot(smollm):
    h, dep, prompt, output = smollm
    bad = dep.model_copy(update={"target": dep.target.model_copy(update={"model": "no-such-model"})})
    slot = Slot("cpu", 0)
    with pytest.raises(SpecPilotError, match=r"scorer on cpu:0 failed: loading no-such-model on cpu:0"):
        WorkerScorer(bad, h, slot).score("r0", prompt, output)
    with lease(h, [slot], timeout_s=5):
        pass


def test_a_worker_that_does_not_answer_in_time_is_stopped_and_named(smollm):
    h, dep, prompt, output = smollm
    slot = Slot("cpu", 0)
    with WorkerScorer(dep, h, slot) as worker:
        worker.score("r0", prompt, output[:2])  # loaded
        proc = worker._proc
        with pytest.raises(
            SpecPilotError, match=r"scorer on cpu:0 failed: no answer in 0 s; the worker was stopped"
        ):
            worker._answer({"op": "score", "prompt": prompt * 8, "output": output}, timeout_s=0.001)
        assert proc.wait(timeout=10) != 0
    with lease(h, [slot], timeout_s=5):
        pass


CONTROLLER = r"""
import sys
from specpilot.controller.scorer_worker import WorkerScorer
from specpilot.controller.slots import Slot
from specpilot.deployments import Home, load_deployment
h = Home.resolve(sys.argv[1])
worker = WorkerScorer(load_deployment("smollm-cpu", h), h, Slot("cpu", 0))
worker.score("r0", [1, 2, 3], [4, 5])
proc = worker._proc  # a question it works on for seconds (~5 s: 3,000 positions on the CPU), unread
proc.stdin.write('{"op": "score", "prompt": %s, "output": [6]}\n' % ([5] * 3000))
proc.stdin.flush()
print(proc.pid, flush=True)
sys.stdin.read()
"""


def test_a_worker_dies_with_its_controller(smollm):
    """A controller killed mid-audit (a device call's budget spent) takes its scorer along, busy
    as it is: it does not wait to find its pipes closed."""
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(smollm[0].root)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    worker = int(ctl.stdout.readline())
    left = left_behind(ctl, [worker], within_s=2)
    assert not left, f"the worker {worker} outlived its controller (state {proc_state(worker)})"
