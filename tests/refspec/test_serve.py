"""The serve protocol (CONTRACTS §2) driven as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from refspec.batch import BatchEngine
from refspec.generate import greedy
from refspec.runtime import Request

from .conftest import TREE, humaneval_prompts, refspec_env


class Server:
    """A `python -m refspec.serve` process; lines are read with their arrival times."""

    def __init__(self, slot: str = "cpu:0", *flags: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refspec.serve", "--device", slot, *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=refspec_env(),
            cwd=TREE,
        )

    def send(self, obj: dict | str) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def read(self) -> tuple[dict, float]:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"server closed stdout; stderr:\n{self.proc.stderr.read()}")
        return json.loads(line), time.perf_counter()

    def until_done(self, rid) -> list[tuple[dict, float]]:
        events = []
        while True:
            event, t = self.read()
            assert event.get("id") == rid, event
            events.append((event, t))
            if event.get("done") or "error" in event:
                return events

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return humaneval_prompts(2)


def test_serve_protocol(engine, prompts):
    server = Server("cpu:0")
    try:
        ready, _ = server.read()
        assert ready["ready"] is True and ready["engine"] == "refspec" and ready["device"] == "cpu:0"
        assert ready["dtype"] == "float32" and ready["mode"] == "spec"
        assert ready["knobs"]["decode"]["block_size"] == 8 and ready["knobs"]["runtime"]["threads"] == 1
        # cpu:0 pins the process to core 0.
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        assert "Cpus_allowed_list:\t0\n" in status

        want, _ = greedy(engine, prompts[0], 40, "spec")
        t_sent = time.perf_counter()
        server.send({"id": "humaneval-0", "input_ids": prompts[0], "max_new_tokens": 40})
        events = server.until_done("humaneval-0")
        chunks = [e["tokens"] for e, _ in events[:-1]]
        done, t_done = events[-1]
        assert all(chunks) and sum(chunks, []) == want  # exactly max_new_tokens, the engine's own output
        assert done["stats"]["new_tokens"] == 40 and done["stats"]["steps"] == len(chunks)
        assert done["stats"]["tau"] == pytest.approx(40 / len(chunks))
        # Streamed per step: the first tokens arrive while later steps are still running.
        t_first = events[0][1]
        assert len(chunks) > 1 and t_first - t_sent < t_done - t_first

        server.send("this is not json")
        event, _ = server.read()
        assert event["id"] is None and "malformed" in event["error"]
        server.send({"id": "bad", "input_ids": [], "max_new_tokens": 4})
        assert "input_ids" in server.read()[0]["error"]
        server.send({"id": "bad2", "input_ids": [1, 2], "max_new_tokens": 0})
        assert "max_new_tokens" in server.read()[0]["error"]

        # Still serving, requests in order.
        server.send({"id": "humaneval-1", "input_ids": prompts[1], "max_new_tokens": 7})
        events = server.until_done("humaneval-1")
        assert sum((e["tokens"] for e, _ in events[:-1]), []) == greedy(engine, prompts[1], 7, "spec")[0]

        server.send({"shutdown": True})
        assert server.proc.wait(timeout=60) == 0
        assert server.proc.stdout.read() == ""
    finally:
        server.close()


def test_groups_with_batch(engine, prompts):
    """--batch: a group's requests are served B at a time, their lines interleaved, each request's
    output the in-process BatchEngine's (itself each request's single-request output, test_batch)."""
    group = [{"id": f"g{i}", "input_ids": p, "max_new_tokens": n}
             for i, (p, n) in enumerate(zip(prompts * 2, [12, 20, 8, 16], strict=True))]  # fmt: skip
    want: dict[str, list[int]] = {r["id"]: [] for r in group}
    for ev in BatchEngine(engine, 2).generate([Request(**r) for r in group], "spec"):
        if "tokens" in ev:
            want[ev["id"]].extend(ev["tokens"])
    server = Server("cpu:0", "--batch")
    try:
        assert server.read()[0]["batch"] is True
        server.send({"id": "G", "batch": 2, "requests": group})
        got: dict[str, list[int]] = {r["id"]: [] for r in group}
        done, order = {}, []
        while True:
            event, _ = server.read()
            if event["id"] == "G":
                break
            order.append(event["id"])
            assert event["id"] not in done, "no line of a request after its done"
            if event.get("done"):
                done[event["id"]] = event["stats"]
            else:
                got[event["id"]].extend(event["tokens"])
        assert got == want and sorted(done) == sorted(got)
        assert all(done[r["id"]]["new_tokens"] == r["max_new_tokens"] for r in group)
        assert event["done"] is True and event["stats"]["batch"] == 2 and event["stats"]["requests"] == 4
        # Two lanes: the first two requests' lines interleave before the third starts.
        assert order.index("g1") < order.index("g0", 1) or order.index("g0") < order.index("g1", 1)
        assert order.index("g2") > order.index("g0")

        # A malformed group: one error line naming the problem, nothing of it served.
        server.send({"id": "H", "batch": 0, "requests": group})
        event, _ = server.read()
        assert event["id"] == "H" and "'batch'" in event["error"]
        bad = [dict(group[0]), dict(group[1], input_ids=[10**9])]
        server.send({"id": "H2", "batch": 2, "requests": bad})
        event, _ = server.read()
        assert event["id"] == "H2" and "vocabulary" in event["error"]
        server.send({"id": "H3", "batch": 2, "requests": [group[0], group[0]]})
        assert "differ" in server.read()[0]["error"]
        # Single requests are still served.
        server.send({"id": "one", "input_ids": prompts[1], "max_new_tokens": 5})
        events = server.until_done("one")
        assert sum((e["tokens"] for e, _ in events[:-1]), []) == greedy(engine, prompts[1], 5, "spec")[0]
    finally:
        server.close()


def test_groups_need_batch_flag(prompts):
    server = Server("cpu:0")
    try:
        assert server.read()[0]["batch"] is False
        server.send(
            {"id": "G", "batch": 2, "requests": [{"id": "a", "input_ids": prompts[0], "max_new_tokens": 2}]}
        )
        event, _ = server.read()
        assert event["id"] == "G" and "--batch" in event["error"]
    finally:
        server.close()


def test_end_of_input_exits_zero():
    server = Server("cpu:0")
    try:
        assert server.read()[0]["ready"] is True
        server.proc.stdin.close()
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.close()


def test_unknown_slot_exits_nonzero_with_the_reason():
    proc = subprocess.run(
        [sys.executable, "-m", "refspec.serve", "--device", "tpu:0"],
        capture_output=True,
        text=True,
        env=refspec_env(),
        cwd=TREE,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "tpu:0" in proc.stderr and "cpu:N or cuda:N" in proc.stderr
