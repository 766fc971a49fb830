"""Hostile candidates that need a GPU: work that outlives the candidate's turn on the device.

    python bench/hostile_gpu.py --home DIR [--deployment smollm-h200] [--only NAME,..] --json OUT

A GPU cannot be frozen as a process can: kernels a system has queued run on after the controller
froze it, into the other system's turn (the interleaved design, one GPU). Each candidate is stock
refspec that, as it sends a request's last tokens, queues a spin kernel on its device with nothing
waiting for it; the baseline's next turn shares the GPU with it. In ABBA order that slows the
baseline's turns that follow the candidate's, and half the slowdown reaches the paired gain.
The controller's carryover check (controller/checks.py) must name it; judged as bench/hostile.py
judges (Phase 0 first where the home has none). Results: bench/results/hostile_gpu_*.json.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hostile import COMMIT, GEN, _edit, cli


def _queue_after_last(cycles: int) -> Callable[[Path], None]:
    """Stock, but a request's last step leaves `cycles` of GPU spin queued behind its tokens."""
    spin = (
        "            if stats.new_tokens >= max_new_tokens and self.device.type == 'cuda':\n"
        f"                __import__('torch').cuda._sleep({cycles})  # queued; nothing waits for it\n"
    )
    return lambda t: _edit(
        t / GEN,
        COMMIT,
        COMMIT.replace("            yield committed\n", spin + "            yield committed\n"),
    )


def candidates(home: Path, deployment: str = "smollm-h200") -> dict[str, tuple[str, Callable[[Path], None]]]:
    """name -> (what it tries, the edit that makes it)."""
    return {
        "queued-spin-10ms": (
            "~10 ms of GPU spin queued behind each answer: runs into the baseline's next turn",
            _queue_after_last(20_000_000),
        ),
        "queued-spin-1ms": (
            "~1 ms of GPU spin queued behind each answer: a slowdown of the baseline near the noise",
            _queue_after_last(2_000_000),
        ),
    }


if __name__ == "__main__":
    cli(__doc__, candidates)
