"""The round's approval report reads at 80 columns (a pipe, CI, a narrow terminal) and on a wide
terminal, and the round's pictures are real PNGs, named in the report."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import matplotlib.image
from rich.console import Console

from specpilot.controller.load import summarize
from specpilot.memory_store.records import VerdictRecord
from specpilot.orchestrator import plots
from specpilot.orchestrator.reports import round_panel

BORDER = "│╭╮╰╯─ "
TITLES = ["raise the n-gram drafter's block size from 8 to 12 to lengthen accepted runs",
          "skip the verification rows whose draft confidence is below 0.3 before the target pass"]  # fmt: skip


def _state(pictures: list[str]) -> dict:
    turns = [f"other load on cpu:{i % 2}: {p}% of the turn went to something besides system {'AB'[i % 2]}"
             for i, p in enumerate((24, 35, 30, 27))]  # fmt: skip
    disturbed = f"measurement disturbed in 4 of 4 blocks ({summarize(turns)}): no verdict"
    return {
        "agent": "memory",
        "baseline": {"commit": "c" * 40, "tree": "a" * 40, "entries": ["refspec-tree"]},
        "costmodel": {
            "tau": 3.12,
            "c": 1.41,
            "speedup": 2.21,
            "largest": "tree",
            "factors": {"tree": 1.35, "kernel": 1.12, "outside": 1.03},
        },  # fmt: skip
        "directions": [
            {"title": t, "target_factor": f, "slot": s}
            for t, f, s in zip(TITLES, ("tree", "kernel"), ("cpu:0", "cpu:1"), strict=True)
        ],  # fmt: skip
        "evaluations": {
            "0": {
                "approved": False,
                "gain": 0.0,
                "lower_bound": 0.0,
                "threshold": 0.021,
                "reasons": [disturbed],
            },
            "1": {"approved": True, "gain": 1.0734, "lower_bound": 1.0412, "threshold": 0.021, "reasons": []},
        },
        "combination": {"kind": "single", "applied": ["1"], "dropped": {}},
        "result": {
            "changed": True,
            "tree": "b" * 40,
            "entries": ["refspec-tree", "r1-d1"],
            "new_entries": ["r1-d1"],
            "seal_check": [{"ok": True}],
        },  # fmt: skip
        "pictures": pictures,
    }


def _render(st: dict, width: int) -> list[str]:
    con = Console(width=width, record=True, color_system=None)
    con.print(round_panel("smollm-cpu", 1, "done", st))
    return con.export_text().splitlines()


def test_the_round_report_reads_at_80_columns(tmp_path):
    st = _state([str(tmp_path / "round.png"), str(tmp_path / "verdict-0a1b2c3d.png")])
    lines = _render(st, 80)
    assert all(len(line) <= 80 for line in lines)
    body = [line.strip(BORDER) for line in lines[1:-1]]
    for line in body:
        words = re.findall(r"[A-Za-zτ]{2,}", line)
        assert len(words) >= 2 or "/" in line or not line, f"a line that says nothing on its own: {line!r}"
    text = " ".join(" ".join(body).split())
    for i, title in enumerate(TITLES):
        assert f"direction {i}: {title}" in text
    # the disturbance, seen in each of four periods, is told once with its range
    assert text.count("other load on a slot") == 1
    assert "24–35% of the turn went to something besides the system (4 times)" in text
    assert "APPROVED gain 1.073 (+7.34%), lower bound 1.041 (+4.12%), bar +2.10%" in text
    assert "pictures: round.png, verdict-0a1b2c3d.png in" in text


def test_a_wide_terminal_gets_one_line_per_fact():
    lines = [line.strip(BORDER) for line in _render(_state([]), 200)]
    for i, title in enumerate(TITLES):
        assert any(line.startswith(f"direction {i}: {title} (factor ") for line in lines)
    assert any(line.startswith("ceiling factors: tree 1.35 · kernel 1.12 · outside 1.03") for line in lines)


def _verdict(approved: bool) -> VerdictRecord:
    gains = [[1.071, 1.082, 1.064, 1.079], [1.068, 1.074, 1.09, 1.061], [1.077, 1.07, 1.069, 1.08]]
    blocks = [sum(b) / len(b) for b in gains]
    return VerdictRecord(
        id="0a1b2c3d-0000-4000-8000-000000000000", deployment="smollm-cpu", run_id=None,
        baseline_tree="a" * 40, candidate_tree="b" * 40, approved=approved, changes_output=False,
        gain=1.0734, lower_bound=1.0412, sigma=0.0055, threshold=0.021, unit="blocks", reasons=[],
        evidence={"request_gains": gains, "block_gains": blocks, "n": 3}, created_at=datetime.now(UTC),
    )  # fmt: skip


def test_the_pictures_are_pngs_of_the_verdict_and_the_round(tmp_path):
    st = _state([])
    paths = plots.round_pictures(tmp_path / "round-1", "round 1 of smollm-cpu", st, [_verdict(True)])
    assert [p.rsplit("/", 1)[1] for p in paths] == ["round.png", "verdict-0a1b2c3d.png"]
    for p in paths:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
        height, width, _ = matplotlib.image.imread(p).shape
        assert width > 400 and height > 200
    # a verdict that measured nothing (a refusal) has no picture; nothing half-written is left
    refused = _verdict(False)
    refused.evidence.clear()
    assert plots.verdict_png(refused, tmp_path / "none.png") is None
    assert sorted(f.name for f in (tmp_path / "round-1").iterdir()) == ["round.png", "verdict-0a1b2c3d.png"]


def test_the_verdict_list_reads_at_80_columns():
    from specpilot.orchestrator.reports import verdict_json, verdict_list

    reason = "lower bound -0.90% does not exceed 1% + 2σ = 2.10%"
    rows = [verdict_json(_verdict(False)) | {"reasons": [reason]}, verdict_json(_verdict(True))]
    con = Console(width=80, record=True, color_system=None)
    con.print(verdict_list(rows))
    lines = con.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[1] == "0a1b2c3d  rejected  smollm-cpu  candidate bbbbbbbbbbbb"
    text = " ".join(" ".join(lines).split())
    assert f"gain 1.073, lower bound 1.041, bar +2.10%; {reason}" in text
    assert lines[4].split()[1] == "approved"
