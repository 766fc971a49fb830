"""The SGLang adapter's HTTP driver against a local server process on loopback.

A real SGLang server needs a GPU, which CI does not have: this edge cannot run here. The server
is `fake_sglang_server.py` — a separate process that speaks SGLang 0.5.20's /health and streaming
/generate format (read from the wheel's source) — launched by the real adapter exactly as it
launches `python -m sglang.launch_server`. Crashes and hangs must become failed runs quickly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specpilot.controller.engine import Request, SystemFailed
from specpilot.controller.sglang import SglangAdapter
from specpilot.controller.slots import Slot
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.knobs import set_knob
from specpilot.deployments.stock.wheel import LAUNCH_FILE

from .sglang_fakes import fake_greedy, make_fake_tree, write_spec

SLOT = Slot("cpu", sorted(os.sched_getaffinity(0))[0])
PROMPT = [101, 2045, 7, 99, 31000, 5]


@pytest.fixture
def adapter(tmp_path: Path) -> SglangAdapter:
    home = Home(tmp_path / "home")
    write_spec(home, "fake-sglang")
    return SglangAdapter(load_deployment("fake-sglang", home), home)


def _started(adapter: SglangAdapter, tree: Path, log: Path):
    system = adapter.start(tree.name, tree, SLOT, log)
    try:
        system.wait_ready(timeout_s=30)
    except BaseException:
        system.stop()
        raise
    return system


def test_stream_is_timed_chunk_by_chunk(adapter, tmp_path):
    tree = make_fake_tree(tmp_path / "tree", step_ms=10)
    log = tmp_path / "logs" / "s.log"
    system = _started(adapter, tree, log)
    try:
        assert system.ready["engine"] == "sglang" and "--speculative-algorithm" in system.ready["command"]
        r = system.run(Request("r1", PROMPT, 40), timeout_s=30)
        usage = system.usage()
    finally:
        system.stop()
    assert r.tokens == fake_greedy(PROMPT, 40)
    assert sum(n for _, n in r.arrivals) == 40 and len(r.arrivals) > 5  # one chunk per decode step
    times = [t for t, _ in r.arrivals]
    assert r.t_send < times[0] and times == sorted(times) and times[-1] == r.t_done
    assert r.seconds >= len(r.arrivals) * 0.010  # the steps' own time, on the controller's clock
    assert r.claims["new_tokens"] == 40 and r.claims["steps"] == len(r.arrivals)
    assert r.claims["tau"] == pytest.approx(40 / len(r.arrivals))  # read from meta_info, kept as a claim
    assert usage["cores"] == str(SLOT.index) and usage["wall_s"] > 0
    text = log.read_text()
    assert text.startswith("# ") and "--speculative-dflash-block-size 4" in text  # the server log is kept
    assert "--host 127.0.0.1" in text and "--device cpu" in text


def test_incremental_chunks_and_ar_mode_from_the_launch_file(adapter, tmp_path):
    tree = make_fake_tree(tmp_path / "tree")
    (tree / LAUNCH_FILE).write_text(
        (tree / LAUNCH_FILE).read_text() + "incremental-streaming-output = true\n"
    )
    system = _started(adapter, tree, tmp_path / "inc.log")
    try:
        inc = system.run(Request("r1", PROMPT, 24), timeout_s=30)
    finally:
        system.stop()
    assert inc.tokens == fake_greedy(PROMPT, 24) and max(n for _, n in inc.arrivals) > 1

    set_knob(tree / LAUNCH_FILE, "decode.mode", "ar")
    system = _started(adapter, tree, tmp_path / "ar.log")
    try:
        ar = system.run(Request("r1", PROMPT, 24), timeout_s=30)
    finally:
        system.stop()
    assert ar.tokens == inc.tokens and [n for _, n in ar.arrivals] == [1] * 24
    assert "tau" not in ar.claims and "speculative" not in " ".join(system.ready["command"])


def test_crash_mid_stream_is_a_failed_run(adapter, tmp_path):
    system = _started(adapter, make_fake_tree(tmp_path / "tree", crash_after_chunks=3), tmp_path / "c.log")
    t0 = time.perf_counter()
    try:
        with pytest.raises(SystemFailed, match="system exited with code 3 while serving request r1") as e:
            system.run(Request("r1", PROMPT, 64), timeout_s=60)
    finally:
        system.stop()
    assert time.perf_counter() - t0 < 10
    assert "fake-sglang: flags" in e.value.log_tail


def test_hang_mid_stream_is_a_failed_run(adapter, tmp_path):
    system = _started(adapter, make_fake_tree(tmp_path / "tree", hang_after_chunks=3), tmp_path / "h.log")
    t0 = time.perf_counter()
    try:
        with pytest.raises(
            SystemFailed, match="system hung: no output within the limit while serving request r1"
        ):
            system.run(Request("r1", PROMPT, 64), timeout_s=1.5)
    finally:
        system.stop()
    assert time.perf_counter() - t0 < 15  # the hang, then SIGTERM to the whole group


def test_failed_launches_are_failed_runs_with_the_log(adapter, tmp_path):
    dead_tree = make_fake_tree(tmp_path / "dead", exit_on_start=1)
    dead = adapter.start("dead", dead_tree, SLOT, tmp_path / "dead.log")
    try:
        with pytest.raises(SystemFailed, match="server exited with code 1 while loading") as e:
            dead.wait_ready(timeout_s=30)
    finally:
        dead.stop()
    assert "failing on start as told" in e.value.log_tail

    tree = make_fake_tree(tmp_path / "typo")
    (tree / LAUNCH_FILE).write_text((tree / LAUNCH_FILE).read_text() + "no-such-flag = 1\n")
    typo = adapter.start("typo", tree, SLOT, tmp_path / "typo.log")
    try:
        with pytest.raises(SystemFailed, match="exited with code 2 while loading") as e:
            typo.wait_ready(timeout_s=30)
    finally:
        typo.stop()
    assert "unrecognized arguments: --no-such-flag 1" in e.value.log_tail

    stuck = adapter.start(
        "stuck", make_fake_tree(tmp_path / "stuck", never_healthy=True), SLOT, tmp_path / "stuck.log"
    )
    t0 = time.perf_counter()
    try:
        with pytest.raises(SystemFailed, match="server not healthy within 2s while loading"):
            stuck.wait_ready(timeout_s=2)
    finally:
        stuck.stop()
    assert time.perf_counter() - t0 < 15


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("port = 9\n", "--port is set by the controller"),
        ('"Bad Flag" = 1\n', "is not a server flag name"),
        ("[other]\n", "unknown section or key \\['other'\\]"),
    ],
)
def test_a_broken_launch_file_fails_the_system_not_the_controller(adapter, tmp_path, extra, message):
    tree = make_fake_tree(tmp_path / "tree")
    (tree / LAUNCH_FILE).write_text((tree / LAUNCH_FILE).read_text() + extra)
    with pytest.raises(SystemFailed, match=message):
        adapter.start("x", tree, SLOT, tmp_path / "x.log")


def test_bad_engine_flags_are_refused_before_anything_runs(tmp_path):
    home = Home(tmp_path)
    write_spec(home, "bad-flags")
    path = home.deployments / "bad-flags.toml"
    path.write_text(path.read_text() + "\n[engine_flags]\nport = 1234\n")
    with pytest.raises(SpecPilotError, match="--port is set by the controller"):
        SglangAdapter(load_deployment("bad-flags", home), home)


def test_chunks_carry_all_tokens_so_far_or_only_the_new_ones():
    from specpilot.controller.sglang import _new_tokens

    assert _new_tokens([], [5, 6], 2) == [5, 6]  # first chunk: both readings agree
    assert _new_tokens([5, 6], [5, 6, 7, 8], 4) == [7, 8]  # cumulative (SGLang's default)
    assert _new_tokens([5, 6], [7, 8], 4) == [7, 8]  # --incremental-streaming-output
    assert _new_tokens([5, 6], [5, 6, 7, 8, 9], 4) == [7, 8, 9]  # the live list ran ahead of meta_info
    assert _new_tokens([5, 6], [5, 9, 7, 8], 4) is None  # rewrites a token already received
    assert _new_tokens([5, 6], [7], 4) is None  # loses a token
