"""Host placement of a GPU slot's systems (placement.py): one core for both, drawn per block, the
controller's threads on the others. Real threads and a real confined process; the H200 figures are
in docs/BENCHMARKS.md (a GPU run, not a CI one)."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from pathlib import Path

import pytest

from specpilot.controller.confine import confine
from specpilot.controller.engine import LineProcess
from specpilot.controller.placement import keep_off, pair_cores, require_pairing
from specpilot.controller.slots import Slot
from specpilot.deployments import Home, SpecPilotError
from tests.controller.confinement import needs_confinement

CORES = set(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(CORES) < 2, reason="placement needs two cores")


def test_a_block_draws_one_host_core_and_leaves_the_rest_to_the_controller():
    seen = set()
    for seed in range(40):
        host, others = pair_cores({0, 1, 2, 3}, random.Random(seed))
        assert len(host) == 1 and host.isdisjoint(others) and set(host) | others == {0, 1, 2, 3}
        seen |= host
    assert seen == {0, 1, 2, 3}, "every core is drawn now and then"


def test_no_core_to_spare_is_one_clear_refusal():
    with pytest.raises(SpecPilotError, match="two cores available"):
        require_pairing({3})
    with pytest.raises(SpecPilotError, match="two cores available"):
        pair_cores({0}, random.Random(0))


def test_a_gpu_slot_with_host_cores_is_the_same_slot():
    placed = Slot("cuda", 0, host=frozenset({1}))
    assert placed == Slot("cuda", 0) and str(placed) == "cuda:0" and placed.host_cores() == {1}
    assert Slot("cuda", 0).host_cores() is None and Slot("cpu", 1).host_cores() == {1}


@two_cores
def test_the_controller_keeps_off_the_systems_core_for_the_block():
    host, others = pair_cores(CORES, random.Random(1))
    before = os.sched_getaffinity(0)
    seen: dict[str, set[int]] = {}
    started = threading.Event()
    done = threading.Event()

    def old_thread() -> None:  # running before the block: pinned too
        started.set()
        done.wait(10)
        seen["old"] = os.sched_getaffinity(0)

    t = threading.Thread(target=old_thread)
    t.start()
    started.wait(10)
    with keep_off(others):
        new = threading.Thread(target=lambda: seen.setdefault("new", os.sched_getaffinity(0)))
        new.start()
        new.join()
        seen["main"] = os.sched_getaffinity(0)
        done.set()
        t.join()
    assert seen["old"] == seen["new"] == seen["main"] == others and not host & others
    assert os.sched_getaffinity(0) == before, "the controller's own affinity comes back after the block"


@two_cores
@needs_confinement
def test_a_system_runs_on_its_host_cores(tmp_path: Path):
    host, _ = pair_cores(CORES, random.Random(2))
    code = "import json, os\nprint(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)\ninput()\n"
    launch = confine([sys.executable, "-I", "-c", code], tree=tmp_path, binds=[], home=Home(tmp_path / "home"),
                     env={"PATH": "/usr/bin:/bin"}, cpus=set(host))  # fmt: skip
    proc = LineProcess(launch, cwd=tmp_path, log=tmp_path / "log", cpus=set(host))
    try:
        _, line = proc.lines.get(timeout=60)
        assert json.loads(line) == sorted(host)
    finally:
        proc.stop(grace_s=2)
