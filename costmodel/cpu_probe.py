"""Peaks of one pinned CPU core, measured on the spot and cached by CPU model (ARCHITECTURE §7).

`python -m specpilot.costmodel.cpu_probe --core N --dtype float32` pins itself to core N with one
torch thread (as a CPU slot runs the system), then measures for about a second and a half:
- copy bandwidth: the best of several `dst.copy_(src)` over buffers far larger than the caches,
  counting the bytes read plus the bytes written;
- matmul rate: the best of several square matmuls in the deployment's dtype.
Best-of is what a peak means; the machine may be shared, and the cache keeps the first result
(delete the cache file or pass refresh to measure again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from specpilot.deployments import Home, SpecPilotError

COPY_BYTES = 128 * 2**20  # per buffer: far beyond any last-level cache of one core's share
MATMUL_N = 1024
PROBE_TIMEOUT_S = 120


def cpu_model() -> str:
    """The CPU's model name (the cache key), from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _best(fn, budget_s: float = 0.6, min_reps: int = 3) -> float:
    """The fastest of as many runs as fit in `budget_s` (at least `min_reps`)."""
    fn()  # warm: page faults and lazy allocation out of the timing
    best, spent, reps = float("inf"), 0.0, 0
    while reps < min_reps or spent < budget_s:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
    return best


def measure(dtype: str) -> dict:
    """Copy bandwidth (bytes/s) and matmul rate (FLOP/s) of this process's one thread."""
    import torch

    torch.set_num_threads(1)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if tdtype is None:
        raise SpecPilotError(f"the CPU probe has no matmul for dtype {dtype!r}; use float32 or bfloat16")
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = _best(lambda: dst.copy_(src))
    a = torch.randn(MATMUL_N, MATMUL_N).to(tdtype)
    b = torch.randn(MATMUL_N, MATMUL_N).to(tdtype)
    out = torch.empty(MATMUL_N, MATMUL_N, dtype=tdtype)
    mm_s = _best(lambda: torch.mm(a, b, out=out))
    return {
        "bandwidth": 2 * COPY_BYTES / copy_s,
        "flops": 2 * MATMUL_N**3 / mm_s,
        "dtype": dtype,
        "torch": torch.__version__,
    }


def _cache_file(home: Home) -> Path:
    return home.cache / "costmodel" / "cpu-probe.json"


def cpu_peaks(home: Home, core: int, dtype: str, *, refresh: bool = False) -> dict:
    """The probed peaks of this machine's CPU model for `dtype` (flops, bandwidth, core, model,
    cache), measured once and cached; devices.py makes the DeviceSpec of them."""
    model = cpu_model()
    path = _cache_file(home)
    cache = json.loads(path.read_text()) if path.is_file() else {}
    key = f"{model}|{dtype}"
    if refresh or key not in cache:
        cache[key] = run_probe(core, dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)  # never a half-written cache
    return cache[key] | {"model": model, "cache": str(path), "core": cache[key].get("core", core)}


def run_probe(core: int, dtype: str) -> dict:
    """Run the probe in a fresh process pinned to `core` (the caller's affinity stays as it is)."""
    cmd = [sys.executable, "-m", "specpilot.costmodel.cpu_probe", "--core", str(core), "--dtype", dtype]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SpecPilotError(f"the CPU probe on core {core} took over {PROBE_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise SpecPilotError(f"the CPU probe on core {core} failed: {proc.stderr.strip()[-500:]}")
    return {**json.loads(proc.stdout), "core": core}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--core", type=int, required=True)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    if args.core not in os.sched_getaffinity(0):
        sys.exit(
            f"core {args.core} is not available to this process (allowed: {sorted(os.sched_getaffinity(0))})"
        )
    os.sched_setaffinity(0, {args.core})
    print(json.dumps(measure(args.dtype)))


if __name__ == "__main__":
    main()
