"""The GPU drain between turns (controller/gpu_load.py) on a real GPU and NVML: another process
answers (synchronizes, prints its time) and then leaves spin kernels queued with nothing waiting
for them, as a frozen system's queued work runs on. Skipped without CUDA or nvidia-ml-py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("pynvml", reason="needs nvidia-ml-py")

CHILD = """
import sys, time, torch
torch.cuda._sleep(1000); torch.cuda.synchronize()
t0 = time.perf_counter(); torch.cuda._sleep(10_000_000); torch.cuda.synchronize()
per_cycle = (time.perf_counter() - t0) / 10_000_000
torch.cuda._sleep(int(0.05 / per_cycle)); torch.cuda.synchronize()  # the turn's own work
print(time.time(), flush=True)  # the answer
if float(sys.argv[1]):  # queued behind it (none at all otherwise: even an empty kernel may read 1%)
    torch.cuda._sleep(int(float(sys.argv[1]) / per_cycle))
time.sleep(10)
"""


def _answer_then_queue(spin_s: float) -> tuple[subprocess.Popen, float]:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(spin_s)], stdout=subprocess.PIPE, text=True)
    return child, float(child.stdout.readline())


@pytest.mark.parametrize("spin_s", [0.0, 0.3])
def test_drain_sees_work_queued_past_the_answer_and_waits_it_out(spin_s):
    from specpilot.controller.gpu_load import GpuWatch

    watch = GpuWatch(torch.cuda.current_device())
    child, answer = _answer_then_queue(spin_s)
    try:
        after = watch.drain(answer)
        done = time.time()
    finally:
        child.kill()
        child.wait()
    seen = [
        (round((ts - answer * 1e6) / 1e3, 1), v) for ts, v in watch._utilization(int((answer - 0.5) * 1e6))
    ]
    why = f"drain gave {after}; samples (ms from the answer, % busy): {seen}"
    assert after is not None, why
    if spin_s:
        assert after >= 0.8 * spin_s and done - answer >= spin_s, why
    else:
        assert after == 0.0, why


def test_a_gpu_slot_another_process_computes_on_is_refused_at_its_lease(home):
    """A process holding a context on the GPU (a server a killed run left behind) is named when the
    slot is leased for timed turns (after the grace a leaving process has); an untimed lease shares
    the GPU; once the process has gone, the timed lease is granted."""
    from specpilot.controller.slots import Slot, lease
    from specpilot.deployments import Home, SpecPilotError

    h, slot = Home.resolve(home), Slot("cuda", torch.cuda.current_device())
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch, time; torch.ones(1, device='cuda'); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child.stdout.readline()
        named = rf"{slot} is in use by another process: pid {child.pid} \(.*-c import torch"
        with pytest.raises(SpecPilotError, match=named), lease(h, [slot], timeout_s=5, timed=True):
            pass
        with lease(h, [slot], timeout_s=5):  # untimed: an audit's scorer, an agent's tools
            pass
    finally:
        child.kill()
        child.wait()
    with lease(h, [slot], timeout_s=5, timed=True):
        pass
