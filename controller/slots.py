"""Device slots (`cpu:N`, `cuda:N`) and leases that are safe across processes.

A lease is an exclusive `flock` on `<home>/locks/slot-<kind>-<N>.lock`; the kernel drops it when
the holder dies, so a crashed controller never leaves a slot taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import SLOT_RE, Home, SpecPilotError


@dataclass(frozen=True, order=True)
class Slot:
    kind: str  # "cpu" or "cuda"
    index: int

    @classmethod
    def parse(cls, text: str) -> Slot:
        m = SLOT_RE.match(text)
        if not m:
            raise SpecPilotError(f"slot {text!r} is not of the form 'cpu:N' or 'cuda:N'")
        return cls(m.group(1), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    def check_exists(self) -> None:
        """Refuse a slot this machine does not have."""
        if self.kind == "cpu":
            if self.index not in os.sched_getaffinity(0):
                raise SpecPilotError(
                    f"slot {self}: CPU core {self.index} is not available to this process "
                    f"(available: {sorted(os.sched_getaffinity(0))}); edit the deployment's devices.slots"
                )
        else:
            import torch

            if not torch.cuda.is_available() or self.index >= torch.cuda.device_count():
                raise SpecPilotError(f"slot {self}: no such CUDA device here; use a cpu deployment")

    def env(self) -> dict[str, str]:
        """Environment a system process on this slot gets (one GPU visible, or nothing)."""
        return (
            {"CUDA_VISIBLE_DEVICES": str(self.index)} if self.kind == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}
        )

    def device_arg(self) -> str:
        """The --device argument for the system: CUDA processes see their GPU as cuda:0."""
        return "cuda:0" if self.kind == "cuda" else str(self)


@contextmanager
def lease(home: Home, slots: Sequence[Slot], timeout_s: float = 3600.0) -> Iterator[list[Slot]]:
    """Hold exclusive leases on `slots` (taken in sorted order, so two leaseholders never deadlock)."""
    locks = home.root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with ExitStack() as stack:
        for slot in sorted(set(slots)):
            fh = stack.enter_context(open(locks / f"slot-{slot.kind}-{slot.index}.lock", "a+"))
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SpecPilotError(
                            f"slot {slot} stayed leased by another process for {timeout_s:.0f}s "
                            f"(lock file {fh.name}); wait for it to finish"
                        ) from None
                    time.sleep(0.05)
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            stack.callback(fcntl.flock, fh, fcntl.LOCK_UN)
        yield list(slots)


def lock_path(home: Home, slot: Slot) -> Path:
    return home.root / "locks" / f"slot-{slot.kind}-{slot.index}.lock"


# -- host cores of GPU slots ------------------------------------------------------------------------
# A GPU system's host side (Python, graph launches, the drafter) is on the critical path of every
# step: left to the scheduler it migrates, shares a core with the controller's threads or with
# another process, and a turn's steps vary by 20% (measured on an H200: 1.31-1.61 ms per step
# between turns of one process). Each GPU slot therefore gets one physical core of its own for the
# systems that run on it (both systems of a one-GPU comparison: they take turns, the idle one
# frozen), and the controller's threads keep off it while systems run.
CONTROLLER_CORES = frozenset(os.sched_getaffinity(0))  # what this process may use, as it started
HOST_CORES = True  # False: GPU systems float over every core (for the noise study in bench/gpu_noise.py)


def _physical_cores(cores: frozenset[int]) -> list[frozenset[int]]:
    """The cores grouped by physical core (SMT siblings together), in order of their first id."""
    groups: dict[frozenset[int], None] = {}
    for c in sorted(cores):
        try:
            text = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text()
            sib = set()
            for part in text.strip().split(","):
                lo, _, hi = part.partition("-")
                sib |= set(range(int(lo), int(hi or lo) + 1))
        except (OSError, ValueError):
            sib = {c}
        groups[frozenset(sib & cores) or frozenset({c})] = None
    return list(groups)


def host_cores(slot: Slot) -> frozenset[int] | None:
    """The physical core (its logical cores) reserved for the systems on GPU slot `slot`: cuda:N
    takes the (N+1)-th from the top of the controller's cores. None for a CPU slot, with HOST_CORES
    off, or where fewer than N + 3 physical cores are there (the controller keeps two)."""
    if slot.kind != "cuda" or not HOST_CORES:
        return None
    phys = _physical_cores(CONTROLLER_CORES)
    if len(phys) < slot.index + 3:
        return None
    return phys[-1 - slot.index]


def host_core(slot: Slot) -> int | None:
    """The one core a system on `slot` runs on: the CPU slot's own, or a GPU slot's host core."""
    if slot.kind == "cpu":
        return slot.index
    cores = host_cores(slot)
    return min(cores) if cores else None


@contextmanager
def keep_off(cores: set[int]) -> Iterator[None]:
    """Move every thread of this process off `cores` (threads started inside inherit it) and back."""
    if not cores or not (rest := set(CONTROLLER_CORES) - cores):
        yield
        return
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        with suppress(OSError):
            os.sched_setaffinity(tid, rest)
    try:
        yield
    finally:
        for tid in [int(t) for t in os.listdir("/proc/self/task")]:
            with suppress(OSError):
                os.sched_setaffinity(tid, CONTROLLER_CORES)
