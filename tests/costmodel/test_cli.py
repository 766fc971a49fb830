"""`specpilot costmodel` and `specpilot replay-tau` on given profile and recording files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

from .builders import humaneval_record, mtbench_record, profile_dict, write_records


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(profile_dict(tau=2.0)))
    rec = write_records(tmp_path / "rec.jsonl", [humaneval_record(), mtbench_record()])
    return prof, rec


def test_costmodel_json(home: Path, files) -> None:
    prof, rec = files
    out = run_cli(
        "--json",
        "costmodel",
        "--deployment",
        "qwen27b-h100",
        "--profile",
        str(prof),
        "--record",
        str(rec),
        home=home,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["deployment"] == "qwen27b-h100"
    assert data["device"]["name"] == "NVIDIA H100 SXM5"
    assert data["speedup"] == pytest.approx(2.0 / (0.036 / 0.024))
    assert data["budget"] == 8 and data["tau_best"] == pytest.approx(17 / 8)
    assert set(data["factors"]) == {"tree", "kernel", "outside"}
    assert data["largest"] in data["factors"]
    assert data["replay"]["budgets"] == [8, 16, 32, 64]


def test_costmodel_rich(home: Path, files) -> None:
    prof, rec = files
    out = run_cli(
        "costmodel",
        "-d",
        "qwen27b-h100",
        "--profile",
        str(prof),
        "--record",
        str(rec),
        "--budget",
        "16",
        home=home,
        check=True,
    )
    for text in (
        "speedup over AR",
        "byte floor",
        "F_tree",
        "F_kernel",
        "F_outside",
        "largest factor",
        "recurrent",
    ):
        assert text in out.stdout


def test_replay_tau(home: Path, files) -> None:
    _, rec = files
    data = json.loads(
        run_cli(
            "--json",
            "replay-tau",
            "-d",
            "smollm-cpu",
            "--record",
            str(rec),
            "--budgets",
            "2,8",
            home=home,
            check=True,
        ).stdout
    )
    assert data["tau"]["chain"]["8"] == pytest.approx(17 / 11)
    assert data["tau"]["best_first"]["2"] == pytest.approx(17 / 9)
    assert data["per_set"]["best_first@8"] == {"humaneval": 4.0, "mtbench": 1.0}
    rich = run_cli("replay-tau", "-d", "smollm-cpu", "--record", str(rec), home=home, check=True).stdout
    assert "humaneval (1 request," in rich and "oracle" in rich and "64 nodes" in rich


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay-tau", "-d", "smollm-cpu", "--record", "/nonexistent.jsonl"], "no such recording"),
        (["replay-tau", "-d", "smollm-cpu", "--record", "REC", "--budgets", "8,x"], "--budgets"),
        (["costmodel", "-d", "nope", "--profile", "P", "--record", "REC"], "unknown deployment"),
        (["costmodel", "-d", "qwen27b-h100", "--profile", "REC", "--record", "REC"], "not JSON"),
        (["costmodel", "-d", "smollm-cpu", "--system", "HEAD"], "has no workspace"),
    ],
)
def test_errors_are_one_line(home: Path, files, args: list[str], message: str) -> None:
    prof, rec = files
    args = [str(rec) if a == "REC" else str(prof) if a == "P" else a for a in args]
    out = run_cli(*args, home=home)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
