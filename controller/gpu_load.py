"""The GPU's own load check: while a system has its turn, nothing else may use its GPU and the GPU
may not throttle. Sampled through NVML (the `nvidia-ml-py` package): the compute processes on the
device (any process outside the systems being measured and the controller is other load), the SM
clock (its range over the turn) and the throttle reasons (power cap, thermal or hardware slowdown).

One throttle is a system's own: the software power cap in the candidate's turn. The cap answers
the power the turn's own kernels draw (a kernel that does more per byte read draws more), so the
clocks it takes away are what the candidate costs on this GPU, timed as such, and the turn is not
set aside for it. Before every turn the GPU is let out of any throttle (`settle`), so a cap the
candidate reached cannot run on into the baseline's turn; a throttle of any kind in a baseline's
turn, or in an A/A run, stays a disturbance, and so do heat and hardware slowdowns anywhere.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from specpilot.deployments import SpecPilotError

# NVML throttle reasons that slow the GPU for reasons of its own (not idling, not app clocks).
SLOWDOWN = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
            0x40: "hardware thermal slowdown", 0x80: "power brake"}  # fmt: skip
CLOCK_RANGE_LIMIT = 0.15  # the SM clock may move this much (min / max) during a turn
SAMPLE_S = 0.1  # NVML queries go through the driver: sample gently while a system is timed
POWER_CAP = "software power cap"
SETTLE_S, SETTLE_POLL_S = 1.0, 0.005  # the longest wait for a throttle to clear before a turn, and its poll


@dataclass
class GpuReport:
    sm_mhz: list[int] = field(default_factory=list)
    throttle: set[str] = field(default_factory=set)
    others: set[int] = field(default_factory=set)

    def to_json(self) -> dict:
        lo, hi = (min(self.sm_mhz), max(self.sm_mhz)) if self.sm_mhz else (None, None)
        return {"sm_mhz_min": lo, "sm_mhz_max": hi, "samples": len(self.sm_mhz), "throttle": sorted(self.throttle),
                "other_pids": sorted(self.others)}  # fmt: skip

    @property
    def power_capped(self) -> bool:
        return POWER_CAP in self.throttle

    def disturbances(self, where: str, own: bool = False) -> list[str]:
        """What else slowed the GPU in the turn. `own`: the turn is the candidate's, so a power cap
        (and the SM clock it lowered) is its own cost, not a disturbance."""
        out = []
        if self.others:
            out.append(f"other processes used {where}: pids {', '.join(map(str, sorted(self.others)))}")
        throttle = self.throttle - {POWER_CAP} if own else self.throttle
        if throttle:
            out.append(f"{where} throttled ({', '.join(sorted(throttle))})")
        moved = self.sm_mhz and min(self.sm_mhz) < (1 - CLOCK_RANGE_LIMIT) * max(self.sm_mhz)
        if moved and not (own and self.power_capped):
            out.append(f"{where}'s SM clock moved from {max(self.sm_mhz)} to {min(self.sm_mhz)} MHz")
        return out


class GpuWatch:
    """Samples one GPU in a thread between `start` and `stop`."""

    def __init__(self, index: int):
        try:
            import pynvml
        except ImportError:
            raise SpecPilotError(
                "the controller watches a GPU slot through NVML: install nvidia-ml-py (pip install 'specpilot[gpu]')"
            ) from None
        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._thread: threading.Thread | None = None

    def throttled(self) -> set[str]:
        mask = self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
        return {name for bit, name in SLOWDOWN.items() if mask & bit}

    def settle(self, limit_s: float = SETTLE_S) -> None:
        """Wait (up to `limit_s`) until the GPU throttles no more; a throttle that outlasts the wait
        is left to the turn's own samples."""
        end = time.perf_counter() + limit_s
        while self.throttled() and time.perf_counter() < end:
            time.sleep(SETTLE_POLL_S)

    def start(self, ours: set[int]) -> None:
        self.report, self._ours, self._stop = GpuReport(), ours | {os.getpid()}, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        n = self.nvml
        i = 0
        while not self._stop.is_set():
            self.report.sm_mhz.append(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM))
            self.report.throttle |= self.throttled()
            if i % 10 == 0:  # the process list is the slow query
                pids = {p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(self.handle)}
                self.report.others |= pids - self._ours
            i += 1
            self._stop.wait(SAMPLE_S)

    def stop(self) -> GpuReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.report


def watch_for(slot) -> GpuWatch | None:
    """A watch for a CUDA slot (None for a CPU slot); CUDA_VISIBLE_DEVICES does not renumber NVML."""
    if slot.kind != "cuda":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = int(visible.split(",")[slot.index]) if visible and visible.split(",")[0].isdigit() else slot.index
    return GpuWatch(index)
