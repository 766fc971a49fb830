"""The round loop end to end on a shrunk smollm-cpu, with the offline memory agent.

Real refspec processes on both CPU cores, real git, real SQLite; the round is run through the
installed `specpilot round` command as a user runs it, killed with SIGKILL in the middle of its
evaluations and resumed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpilot.deployments import Home
from specpilot.deployments.registry import SHIPPED
from specpilot.memory_store import connect, records
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.quiet,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="paired runs need two CPU cores"),
]

NAME = "smollm-round"


def _spec(home: Path) -> None:
    text = (SHIPPED / "smollm-cpu.toml").read_text()
    text = text.replace('name = "smollm-cpu"', f'name = "{NAME}"')
    text = text.replace("sets = { humaneval = 5, mtbench = 2 }", "sets = { humaneval = 3 }")
    text = text.replace("max_new_tokens = 64", "max_new_tokens = 16")
    # the fewest blocks a verdict takes, and an audit of the timed outputs alone (no top-up: 1024
    # positions of 16 tokens are 64 more requests): this test is about the loop, not about power
    text = re.sub(
        r"(?m)^blocks = .*\n^budget_s = .*\n^max_blocks = .*$",
        "blocks = 3\nbudget_s = 20\nmax_blocks = 3\naudit_positions = 48",
        text,
    )
    (home / "deployments").mkdir(parents=True, exist_ok=True)
    (home / "deployments" / f"{NAME}.toml").write_text(text)


def _round_state(home: Path, number: int) -> dict:
    rec = records.get_round(connect(Home(home)), NAME, number)
    assert rec is not None
    return {"status": rec.status, **rec.state}


def test_round_kill_resume_then_second_round(tmp_path):
    home = tmp_path / "home"
    _spec(home)
    env = {**os.environ, "SPECPILOT_HOME": str(home)}
    exe = str(Path(sys.executable).parent / "specpilot")
    proc = subprocess.Popen([exe, "round", "--deployment", NAME, "--agent", "memory"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    # Wait until the first evaluation is stored, then kill the round's whole process group.
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        time.sleep(2)
        try:
            st = _round_state(home, 1)
        except Exception:  # the database may not exist yet
            continue
        if len(st.get("evaluations", {})) >= 1 and "evaluate" not in st.get("finished", []):
            break
        assert proc.poll() is None, proc.stderr.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log = proc.stdout.read().decode()  # into a pipe, progress comes as a line per step, with seconds
    assert re.search(r"^\[\s*\d+s\] phase0: ", log, re.M) and "s] evaluate: direction 0" in log, log
    before = _round_state(home, 1)
    assert before["status"] == "running"
    judged = dict(before["evaluations"])
    assert judged

    # A new round is refused while round 1 is unfinished.
    refused = run_cli("round", "--deployment", NAME, home=home)
    assert refused.returncode == 2 and "--resume 1" in refused.stderr

    done = run_cli("--json", "round", "--deployment", NAME, "--resume", "1", home=home, check=True)
    state = json.loads(done.stdout)
    after = _round_state(home, 1)
    assert after["status"] == "done"
    for i, ev in judged.items():  # nothing finished was redone or lost
        assert after["evaluations"][i]["verdict_id"] == ev["verdict_id"]
    verdicts = {v.id for v in records.list_verdicts(connect(Home(home)), NAME)}
    assert {ev["verdict_id"] for ev in after["evaluations"].values() if ev.get("verdict_id")} <= verdicts
    assert state["costmodel"]["largest"] in ("tree", "kernel", "outside")
    assert len(state["directions"]) == 2

    seal = run_cli("--json", "seal-check", "--all", home=home, check=True)
    assert all(r["ok"] for r in json.loads(seal.stdout))

    # The report through a pipe is 80 columns wide; the round's pictures are beside it and named.
    report = run_cli("report", "1", "--deployment", NAME, home=home, check=True).stdout
    assert "round 1 of smollm-round" in report and "direction 0: " in report
    assert max(len(line) for line in report.splitlines()) <= 80
    pictures = [Path(p) for p in after["pictures"]]
    assert pictures[0].name == "round.png"  # and one per verdict that measured blocks
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pictures)
    assert all(p.parent == Home(home).round_dir(NAME, 1) for p in pictures)
    assert f"pictures: {', '.join(p.name for p in pictures)} in" in " ".join(report.split())

    second = json.loads(run_cli("--json", "round", "--deployment", NAME, home=home, check=True).stdout)
    assert second["round"] == 2
    assert second["baseline"]["tree"] == state["result"]["tree"]
    first_keys = {d["key"] for d in state["directions"]}
    if not state["result"]["changed"]:  # same system: the memory agent must not repeat a judged direction
        assert not first_keys & {d["key"] for d in second["directions"]}
