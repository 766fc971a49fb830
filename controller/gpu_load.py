"""The GPU's own load check: while a system has its turn, nothing else may use its GPU and the GPU
may not throttle. Sampled through NVML (the `nvidia-ml-py` package): the compute processes on the
device (any process outside the systems being measured and the controller is other load), the SM
clock (its range over the turn) and the throttle reasons (power cap, thermal or hardware slowdown).

One throttle is a system's own: the software power cap in its own turn, where two different
systems are compared. The cap answers the power the turn's own kernels draw (a kernel that does
more per byte read draws more), so the clocks it takes away are what that system costs on this
GPU, timed as such, and the turn is not set aside for it: a baseline that was approved for a
kernel of that kind (W12) caps itself in its turns as it did as a candidate. Before every turn the
GPU is let out of any throttle (`settle`), and the other system's kernels are drained (below), so
neither system's cap can run on into the other's turn. The power limit the cap enforces is read
in every turn (`power_limit_w`): a system that could set it (as root) and lowered it for the other's
turns is a finding (checks.power_limit_moved). In an A/A run a cap stays a disturbance, and so do
heat and hardware slowdowns anywhere.

A GPU cannot be frozen as a process can: kernels a system queued before it was frozen run on. So
when the GPU passes to another system, the controller waits until the GPU is idle (`drain`, from
NVML's utilization samples) and the next turn starts only then. Kernels seen running after a
system's last answer are named: work outside its timed turn (checks.queued_past_answer).

A GPU slot is refused when it is leased for judged turns while another process computes on it
(`refuse_strangers`): a server left behind by a killed run served on through every later block
of a round on the lent H100 (2026-12-07), each block set aside as disturbed only after it ran.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.deployments import SpecPilotError

# NVML throttle reasons that slow the GPU for reasons of its own (not idling, not app clocks).
SLOWDOWN = {0x4: "software power cap", 0x8: "hardware slowdown", 0x20: "software thermal slowdown",
            0x40: "hardware thermal slowdown", 0x80: "power brake"}  # fmt: skip
CLOCK_RANGE_LIMIT = 0.15  # the SM clock may move this much (min / max) during a turn
SAMPLE_S = 0.1  # NVML queries go through the driver: sample gently while a system is timed
POWER_CAP = "software power cap"
SETTLE_S, SETTLE_POLL_S = 1.0, 0.005  # the longest wait for a throttle to clear before a turn, and its poll
DRAIN_S, DRAIN_POLL_S = 5.0, 0.01  # the longest wait for the GPU to be idle after a turn, and its poll
STRANGER_GRACE_S = 30.0  # how long a process found on a newly leased GPU may take to leave (a stopped
# system's children and a large context go after its leader)


@dataclass
class GpuReport:
    sm_mhz: list[int] = field(default_factory=list)
    throttle: set[str] = field(default_factory=set)
    others: set[int] = field(default_factory=set)
    power_limit_w: set[int] = field(default_factory=set)  # the enforced power limit, as read in the turn
    # `drain` waited for the GPU after the turn (another system's came next), this long, and saw
    # kernels run this long past the turn's last answer (None: still running at its limit)
    drained: bool = False
    drain_s: float = 0.0
    busy_after_answer_s: float | None = 0.0

    def to_json(self) -> dict:
        lo, hi = (min(self.sm_mhz), max(self.sm_mhz)) if self.sm_mhz else (None, None)
        out = {"sm_mhz_min": lo, "sm_mhz_max": hi, "samples": len(self.sm_mhz), "throttle": sorted(self.throttle),
               "other_pids": sorted(self.others), "power_limit_w": sorted(self.power_limit_w)}  # fmt: skip
        drain = {"drain_s": round(self.drain_s, 4), "busy_after_answer_s": self.busy_after_answer_s}
        return out | (drain if self.drained else {})

    @property
    def power_capped(self) -> bool:
        return POWER_CAP in self.throttle

    def disturbances(self, where: str, own: bool = False) -> list[str]:
        """What else slowed the GPU in the turn. `own`: the turn's system is one of two different
        systems compared, so a power cap in its turn (and the SM clock it lowered) is its own cost,
        not a disturbance."""
        out = []
        if self.others:
            out.append(f"other processes used {where}: pids {', '.join(map(str, sorted(self.others)))}")
        throttle = self.throttle - {POWER_CAP} if own else self.throttle
        if throttle:
            out.append(f"{where} throttled ({', '.join(sorted(throttle))})")
        moved = self.sm_mhz and min(self.sm_mhz) < (1 - CLOCK_RANGE_LIMIT) * max(self.sm_mhz)
        if moved and not (own and self.power_capped):
            out.append(f"{where}'s SM clock moved from {max(self.sm_mhz)} to {min(self.sm_mhz)} MHz")
        if self.drained and self.busy_after_answer_s is None:
            out.append(f"{where} was still busy {DRAIN_S:.0f} s after the turn's last answer: the next turn ran beside "
                       "its kernels")  # fmt: skip
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

    def _utilization(self, after_us: int) -> list[tuple[int, int]]:
        """NVML's GPU utilization samples newer than `after_us` (the CPU clock, µs): (time stamp,
        percent of the sample's period in which a kernel ran), the period ending at the time stamp."""
        n = self.nvml
        try:
            _, samples = n.nvmlDeviceGetSamples(self.handle, n.NVML_GPU_UTILIZATION_SAMPLES, after_us)
        except n.NVMLError_NotFound:  # none newer yet
            return []
        except n.NVMLError as e:
            raise SpecPilotError(
                f"the controller drains a GPU between systems' turns through NVML's utilization samples, and this "
                f"GPU or driver gives none ({e}): judge on a GPU whose driver reports them (nvidia-smi -q -d UTILIZATION)"
            ) from None
        return sorted((s.timeStamp, s.sampleValue.uiVal) for s in samples if s.timeStamp > after_us)

    def drain(self, answer_s: float, limit_s: float = DRAIN_S) -> float | None:
        """Wait until the GPU is idle after a turn whose last answer went out at `answer_s`
        (time.time()): until a utilization sample whose whole period lies after the answer reads 0.
        Returns for how long after the answer kernels were seen running (0.0: none; the end of the
        last busy sample's period, so a bound to the sample period), or None if the GPU is still
        busy at `limit_s`."""
        since = int(answer_s * 1e6)
        seen: list[tuple[int, int]] = []  # samples after the answer; the first may straddle it
        end = time.perf_counter() + limit_s
        while True:
            seen += self._utilization(seen[-1][0] if seen else since)
            for i in range(1, len(seen)):
                if seen[i][1] == 0:
                    busy = [ts for ts, v in seen[1:i] if v > 0]
                    return (busy[-1] - since) / 1e6 if busy else 0.0
            if time.perf_counter() >= end:
                return None
            time.sleep(DRAIN_POLL_S)

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
                self.report.power_limit_w.add(n.nvmlDeviceGetEnforcedPowerLimit(self.handle) // 1000)
            i += 1
            self._stop.wait(SAMPLE_S)

    def stop(self) -> GpuReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.report


def refuse_strangers(slot, grace_s: float = STRANGER_GRACE_S) -> None:
    """Refuse a newly leased GPU slot that another process computes on (waiting `grace_s` for one
    that is leaving): it would be in every turn of every block, and each would be set aside as
    disturbed only after it ran. Only this process may hold a context there (nothing of the run
    has started yet)."""
    watch = watch_for(slot)
    if watch is None:
        return
    n, end = watch.nvml, time.perf_counter() + grace_s
    while True:
        try:
            procs = [p for p in n.nvmlDeviceGetComputeRunningProcesses(watch.handle) if p.pid != os.getpid()]
        except n.NVMLError:  # no process list here: the turns' own watch reports what it can
            return
        if not procs or time.perf_counter() >= end:
            break
        time.sleep(0.1)
    if procs:
        who = "; ".join(
            f"pid {p.pid} ({_cmdline(p.pid)}, {(p.usedGpuMemory or 0) / 2**30:.1f} GiB)" for p in procs
        )
        raise SpecPilotError(
            f"{slot} is in use by another process: {who}. Work beside a judged system disturbs every turn; "
            f"stop it (kill {' '.join(str(p.pid) for p in procs)}) or wait for it, then run again"
        )


def _cmdline(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "not in this PID namespace"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    return text[:120] or "no command line"


def watch_for(slot) -> GpuWatch | None:
    """A watch for a CUDA slot (None for a CPU slot); CUDA_VISIBLE_DEVICES does not renumber NVML."""
    if slot.kind != "cuda":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = int(visible.split(",")[slot.index]) if visible and visible.split(",")[0].isdigit() else slot.index
    return GpuWatch(index)
