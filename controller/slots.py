"""Device slots (`cpu:N`, `cuda:N`) and leases that are safe across processes.

A lease is an exclusive `flock` on `<home>/locks/slot-<kind>-<N>.lock`; the kernel drops it when
the holder dies, so a crashed controller never leaves a slot taken.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specpilot.deployments import SLOT_RE, Home, SpecPilotError

from .gpu_load import refuse_strangers


@dataclass(frozen=True, order=True)
class Slot:
    kind: str  # "cpu" or "cuda"
    index: int
    # A GPU slot's host cores for a block (placement.py): where its systems' processes run. Not part
    # of the slot's identity: equality, order and the name are kind and index alone.
    host: frozenset[int] = field(default=frozenset(), compare=False)

    def host_cores(self) -> set[int] | None:
        """The cores a system on this slot is pinned to: a CPU slot's core, a GPU slot's host cores
        (None where none are placed)."""
        return {self.index} if self.kind == "cpu" else (set(self.host) or None)

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
def lease(
    home: Home, slots: Sequence[Slot], timeout_s: float = 3600.0, timed: bool = False
) -> Iterator[list[Slot]]:
    """Hold exclusive leases on `slots` (taken in sorted order, so two leaseholders never deadlock).
    `timed`: the lease is for judged timed turns (Phase 0's, the noise run's and a comparison's
    blocks), so a GPU slot another process computes on is refused (gpu_load.refuse_strangers);
    other work (an audit's scorer, a profile, an agent's tools beside a sibling agent's GPU work)
    shares the GPU as it may."""
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
        for slot in slots if timed else ():
            if slot.kind == "cuda":
                refuse_strangers(slot)
        yield list(slots)


def lock_path(home: Home, slot: Slot) -> Path:
    return home.root / "locks" / f"slot-{slot.kind}-{slot.index}.lock"
