"""Host placement of a GPU slot's systems: both on the same host core, the controller elsewhere.

A GPU system's host thread is busy for the whole request (it launches, syncs, drafts), so the host
core's speed is in every GPU timing; two systems on cores of their own carry two cores' speeds,
a per-process offset that does not cancel in their ratio (9–10% per-request spread on an H200).
Sharing one core pairs them as the sliced CPU design pairs its systems: they take turns on it
(interleaved design: the idle one frozen), so the core's speed is in both alike. The core is drawn
per block among the cores this process may use; the controller's own threads are pinned to the
others for the block (`keep_off`), and the load check watches the systems' core (period.py).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator

from specpilot.deployments import SpecPilotError


def available_cores() -> set[int]:
    return set(os.sched_getaffinity(0))


def require_pairing(cores: set[int]) -> None:
    """Refuse, in one line, a machine with no core to spare for pairing."""
    if len(cores) < 2:
        raise SpecPilotError(
            f"pairing a GPU slot's systems on one host core needs two cores available to the controller (one "
            f"for the systems, one for the controller's own threads); it has {sorted(cores)}: run it with more "
            "cores (taskset, the container's CPU limit)"
        )


def pair_cores(cores: set[int], rng: random.Random) -> tuple[frozenset[int], set[int]]:
    """(the systems' host core, the controller's cores) for one block: a core drawn at random."""
    require_pairing(cores)
    host = rng.choice(sorted(cores))
    return frozenset({host}), cores - {host}


@contextlib.contextmanager
def keep_off(cores: set[int]) -> Iterator[None]:
    """Pin every thread of this process to `cores` for the block (threads started meanwhile inherit
    it from the thread that starts them), and give each its own affinity back after."""
    saved: dict[int, set[int]] = {}
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
    try:
        yield
    finally:
        for tid, was in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, was)
