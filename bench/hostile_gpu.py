"""Hostile candidates that need a GPU: work that outlives the candidate's turn on the device.

    python bench/hostile_gpu.py --home DIR [--deployment smollm-h200] [--only NAME,..] --json OUT

A GPU cannot be frozen as a process can: kernels a system has queued run on after the controller
froze it, into the other system's turn (the interleaved design, one GPU). Each candidate is stock
refspec that, as it sends a request's last tokens, queues a spin kernel on its device with nothing
waiting for it. Two defences stand against it: the controller drains the GPU where it passes to
the other system (gpu_load.GpuWatch.drain), so the spin runs into no one's turn, and names a
candidate busy past its answers more often than the baseline (checks.queued_past_answer); behind
them, the carryover fit (checks.carryover) names a baseline slowed right after the candidate's
turns. Judged as bench/hostile.py judges (Phase 0 first where the home has none). Results:
bench/results/hostile_gpu_*.json.

`queued-spin-pair` spins ~0.45 s after its second turn in a row (ABBA gives each system two in a
row), long enough to span both of the baseline's turns that follow were the GPU not drained: then
the baseline's turn after its own is slowed as well and the carryover fit compares two slowed
turns; the baseline against its own record (checks.baseline_slowed, 15%) was the check left.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hostile import COMMIT, GEN, SERVE_LOOP, _edit, cli

LAST_YIELD = "            yield committed\n"


def _at_last_step(code: str, prelude: str = "") -> Callable[[Path], None]:
    """Stock, but `code` runs on a request's last step just before its tokens go out (`prelude`:
    at the start of each request)."""

    def edit(t: Path) -> None:
        if prelude:
            _edit(t / GEN, SERVE_LOOP, SERVE_LOOP + prelude)
        last = "            if stats.new_tokens >= max_new_tokens:\n" + code
        _edit(t / GEN, COMMIT, COMMIT.replace(LAST_YIELD, last + LAST_YIELD))

    return edit


def _spin(cycles: int, when: str = "") -> str:
    """GPU spin queued on the system's stream (where `when` holds); nothing waits for it."""
    cond = f"{when} and " if when else ""
    return (
        f"                if {cond}self.device.type == 'cuda':\n"
        f"                    __import__('torch').cuda._sleep({cycles})\n"
    )


def _queue_after_last(cycles: int) -> Callable[[Path], None]:
    """A request's last step leaves `cycles` of GPU spin queued behind its tokens."""
    return _at_last_step(_spin(cycles))


def _queue_after_pair(cycles: int) -> Callable[[Path], None]:
    """After the second of its two turns in a row (its request came right after its own last
    answer: nothing ran between) it queues `cycles` of spin, enough to span the baseline's two
    turns that follow in ABBA order, so the baseline's turn after its own is slowed as much as the
    one after the candidate's."""
    mark = (
        "        _t = __import__('time').perf_counter\n"
        "        _last = getattr(Engine, '_hostile_last', None)\n"
        "        _second = _last is not None and _t() - _last < 0.03  # no other turn between\n"
    )
    return _at_last_step(_spin(cycles, "_second") + "                Engine._hostile_last = _t()\n", mark)


def candidates(home: Path, deployment: str = "smollm-h200") -> dict[str, tuple[str, Callable[[Path], None]]]:
    """name -> (what it tries, the edit that makes it)."""
    return {
        "queued-spin-10ms": (
            "~10 ms of GPU spin queued behind each answer: runs into the baseline's next turn",
            _queue_after_last(20_000_000),
        ),
        "queued-spin-pair": (
            "~0.45 s of GPU spin after its second turn in a row: spans both baseline turns that follow, so "
            "the one after the baseline's own turn is slowed too (beyond what the carryover fit compares)",
            _queue_after_pair(900_000_000),
        ),
        "queued-spin-1ms": (
            "~1 ms of GPU spin queued behind each answer: a slowdown of the baseline near the noise",
            _queue_after_last(2_000_000),
        ),
    }


if __name__ == "__main__":
    cli(__doc__, candidates)
