"""Shared test setup: one weights/workload cache for the whole run, a fresh home per test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Converted weights and downloaded workload files are reused across tests and runs.
os.environ.setdefault("SPECPILOT_CACHE", str(REPO / ".specpilot" / "cache"))


# The suite runs on pytest-xdist workers (README: `pytest -n 2`). Tests marked `quiet` time real
# systems on the machine's cores, and the controller's load check rightly refuses a period another
# process disturbed, so a quiet test runs alone: every test holds the run's lock shared, a quiet one
# exclusively. A quiet test first takes the turnstile, so the other worker cannot slip test after
# test in ahead of it (flock grants no order of its own).
def _lock(name: str):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing runs beside a test
        return None
    path = Path(tempfile.gettempdir()) / f"specpilot-tests-{run}.{name}"
    return open(path, "a")  # noqa: SIM115  (held for the whole run)


_ROOM, _TURNSTILE = _lock("room"), _lock("turnstile")
# A worker whose next test is quiet too keeps the room from one quiet test to the next (a quiet
# module's tests one after another): let go between them, the room let one test of the other worker
# in each time, which then ran alone while this worker waited for it (a core idle).
_HOLDING = [False]


def _quiet(item) -> bool:
    return item is not None and item.get_closest_marker("quiet") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Hold the room for the test's setup, call and teardown (module fixtures included), and give
    the process its CPU affinity back after: a test that opens a refspec engine in-process pins
    it to the slot's core, and every later test of the worker (a controller and its children, a Ray
    node) would inherit that one core."""
    cores = os.sched_getaffinity(0)
    if _ROOM is None:
        yield
        os.sched_setaffinity(0, cores)
        return
    quiet = _quiet(item)
    if _HOLDING[0] and not quiet:  # kept for a quiet test that did not come: let go, then queue as usual
        fcntl.flock(_ROOM, fcntl.LOCK_UN)
        _HOLDING[0] = False
    if not _HOLDING[0]:
        fcntl.flock(_TURNSTILE, fcntl.LOCK_EX)
        try:
            fcntl.flock(_ROOM, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        finally:
            fcntl.flock(_TURNSTILE, fcntl.LOCK_UN)
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)
        _HOLDING[0] = quiet and _quiet(nextitem)
        if not _HOLDING[0]:
            with contextlib.suppress(OSError):
                fcntl.flock(_ROOM, fcntl.LOCK_UN)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh SPECPILOT_HOME (the cache stays shared through SPECPILOT_CACHE)."""
    path = tmp_path / "home"
    monkeypatch.setenv("SPECPILOT_HOME", str(path))
    return path


def run_cli(*args: str, home: Path | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the installed `specpilot` console script in a real subprocess."""
    env = dict(os.environ)
    if home is not None:
        env["SPECPILOT_HOME"] = str(home)
    exe = Path(sys.executable).parent / "specpilot"
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"specpilot {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def phase0(dep, home, tries: int = 3) -> dict:
    """`controller.run_phase0`, its A/A noise run tried again (up to `tries` runs in all) when the
    load check refuses it as disturbed. On a CI VM the hypervisor now and then steals 10-16% of a
    turn, which the check rightly counts as other load (the turn records show foreign_s = steal_s);
    the controller's refusal is correct, the fixture just needs a quiet stretch. Any other error
    fails at once."""
    from specpilot import controller
    from specpilot.deployments import SpecPilotError
    from specpilot.memory_store import connect, records

    for attempt in range(tries):
        try:
            if attempt == 0:
                return controller.run_phase0(dep, home)
            figures = records.get_state(connect(home), dep.name, "phase0")
            return figures | {"noise": controller.measure_noise(dep, home)}
        except SpecPilotError as e:
            if "noise run was disturbed" not in str(e) or attempt == tries - 1:
                raise
    raise ValueError(f"tries must be at least 1 (got {tries})")
