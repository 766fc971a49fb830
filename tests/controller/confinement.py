"""What confined-run tests share: the skip where the machine cannot confine (saying why), and
killing a controller to see what of it outlived it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from specpilot.controller.confine import check_available
from specpilot.deployments import SpecPilotError


def _why() -> str | None:
    try:
        check_available()
    except SpecPilotError as e:
        return str(e)
    return None


CONFINE = _why()
needs_confinement = pytest.mark.skipif(CONFINE is not None, reason=f"cannot confine here: {CONFINE}")


def proc_state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...) from /proc/<pid>/stat."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def left_behind(ctl: subprocess.Popen, pids: list[int], within_s: float = 10.0) -> list[int]:
    """Kill the controller `ctl`; the processes of `pids` still there (not zombies) `within_s` later."""
    ctl.kill()
    ctl.wait()
    deadline = time.monotonic() + within_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and proc_state(p) != "Z"]
    return alive
