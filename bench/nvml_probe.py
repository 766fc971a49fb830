"""What NVML can tell the controller about work still on the GPU after a system's last answer.

    python3 bench/nvml_probe.py --json OUT          # on the device (torch and nvidia-ml-py)

The GPU judge's carryover hole (docs/BENCHMARKS.md): a frozen process's queued kernels run on into
the next system's turn. To drain the GPU between turns the controller (which has no CUDA context of
its own) must see, from NVML alone, that kernels still run after a turn's last answer. This probe
measures what that costs and how well it sees:
- the sample period of `nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)` and of per-process
  utilization (`nvmlDeviceGetProcessUtilization`), idle and busy;
- for spins of 0, 1, 10 and 100 ms queued after a synchronize (the "answer"): how long until a
  sample that starts after the answer reads 0, and whether any such sample reads busy;
- `--ctx`: the other way to see it, from a CUDA context of the watcher's own: another process
  answers and leaves a spin queued; the watcher times a tiny kernel and a synchronize, again and
  again. Contexts share the GPU in time slices, so while the other's spin runs the tiny kernel
  waits for a slice: its latency shows the other's queued work within a slice, not 200 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time

import pynvml
import torch


def _samples(h, last_us: int) -> list[tuple[int, int]]:
    try:
        _, s = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_us)
    except pynvml.NVMLError_NotFound:
        return []
    return [(x.timeStamp, x.sampleValue.uiVal) for x in s]


def _period(h, seconds: float, busy: bool) -> dict:
    seen: list[tuple[int, int]] = []
    last = 0
    end = time.time() + seconds
    while time.time() < end:
        if busy:
            torch.cuda._sleep(2_000_000)
        for ts, v in _samples(h, last):
            if ts > last:
                seen.append((ts, v))
                last = ts
        time.sleep(0.002)
    torch.cuda.synchronize()
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
    return {"samples": len(seen), "period_us_median": statistics.median(gaps) if gaps else None,
            "period_us_min": min(gaps, default=None), "period_us_max": max(gaps, default=None),
            "values": [v for _, v in seen[-20:]]}  # fmt: skip


def _after_answer(h, spin_cycles: int, limit_s: float = 3.0) -> dict:
    torch.cuda.synchronize()
    time.sleep(0.5)  # idle before
    torch.cuda._sleep(20_000_000)  # the turn's own work
    torch.cuda.synchronize()  # the answer goes out
    answer_us = time.time_ns() // 1000
    if spin_cycles:
        torch.cuda._sleep(spin_cycles)  # queued behind the answer, nothing waits for it
    t0 = time.perf_counter()
    after: list[tuple[int, int]] = []
    last = answer_us
    idle_s = None
    while time.perf_counter() - t0 < limit_s:
        for ts, v in _samples(h, last):
            if ts > last:
                after.append((ts, v))
                last = ts
        # a sample is trusted once its whole period lies after the answer: the second one past it
        late = after[1:]
        if late and late[-1][1] == 0:
            idle_s = time.perf_counter() - t0
            break
        time.sleep(0.001)
    torch.cuda.synchronize()
    return {"spin_cycles": spin_cycles, "idle_after_s": idle_s,
            "busy_seen_after_answer": any(v > 0 for _, v in after[1:]),
            "samples": [(ts - answer_us, v) for ts, v in after]}  # fmt: skip


def _process_samples(h, seconds: float) -> dict:
    last, seen = time.time_ns() // 1000, []
    end = time.time() + seconds
    while time.time() < end:
        torch.cuda._sleep(2_000_000)
        try:
            for p in pynvml.nvmlDeviceGetProcessUtilization(h, last):
                seen.append((p.timeStamp, p.pid, p.smUtil))
                last = max(last, p.timeStamp)
        except pynvml.NVMLError as e:
            return {"error": str(e)}
        time.sleep(0.005)
    torch.cuda.synchronize()
    ts = sorted({s[0] for s in seen})
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    return {"samples": len(seen), "period_us_median": statistics.median(gaps) if gaps else None,
            "last": seen[-5:]}  # fmt: skip


CHILD = """
import sys, time, torch
torch.cuda._sleep(1000); torch.cuda.synchronize()
torch.cuda._sleep(int(sys.argv[2])); torch.cuda.synchronize()
print(time.perf_counter(), flush=True)
torch.cuda._sleep(int(sys.argv[1]))
time.sleep(3)
"""


def _ctx_probe(spin_cycles: int, own_cycles: int) -> dict:
    """Latency of a tiny kernel + synchronize in this process, from another process's answer on,
    while that process's `spin_cycles` of queued spin run (perf_counter is system-wide)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(spin_cycles), str(own_cycles)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    answer = float(child.stdout.readline())
    lat = []
    while time.perf_counter() - answer < 0.3:
        t0 = time.perf_counter()
        torch.cuda._sleep(100)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        lat.append((round((t0 - answer) * 1e3, 3), round((t1 - t0) * 1e6, 1)))
    child.kill()
    child.wait()
    slow = [t for t, us in lat if us > 200]
    return {"spin_cycles": spin_cycles, "probes": len(lat), "first_ms": lat[0][0] if lat else None,
            "median_us": statistics.median(us for _, us in lat) if lat else None,
            "last_slow_ms": max(slow, default=None), "slow": len(slow), "lat": lat[:40] + lat[-5:]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--ctx", action="store_true", help="only the CUDA-context probe")
    a = ap.parse_args()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    torch.cuda.init()
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
    ns_per_cycle = (time.perf_counter() - t0) * 1e9 / 100_000_000
    out = {"device": torch.cuda.get_device_name(), "driver": pynvml.nvmlSystemGetDriverVersion(),
           "ns_per_spin_cycle": ns_per_cycle}  # fmt: skip
    if a.ctx:
        ms = lambda x: int(x * 1e6 / ns_per_cycle)  # noqa: E731
        out["ctx"] = [_ctx_probe(ms(spin), ms(20)) | {"spin_ms": spin} for spin in (0, 0, 1, 10, 10, 50, 50)]
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        for r in out["ctx"]:
            print(f"spin {r['spin_ms']:>3} ms: {r['probes']} probes from {r['first_ms']} ms, median {r['median_us']} us, "
                  f"{r['slow']} over 200 us, the last at {r['last_slow_ms']} ms")  # fmt: skip
        return
    out |= {"idle": _period(h, 1.5, False), "busy": _period(h, 1.5, True)}
    out["after_answer"] = [
        _after_answer(h, int(ms * 1e6 / ns_per_cycle)) | {"spin_ms": ms}
        for ms in (0, 0, 1, 1, 10, 10, 100, 100)
    ]
    out["process"] = _process_samples(h, 1.5)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    for r in out["after_answer"]:
        print(
            f"spin {r['spin_ms']:>5} ms: idle after {r['idle_after_s']}, busy seen {r['busy_seen_after_answer']}"
        )
    print("idle period", out["idle"]["period_us_median"], "busy period", out["busy"]["period_us_median"])
    print("process", {k: v for k, v in out["process"].items() if k != "last"})


if __name__ == "__main__":
    main()
