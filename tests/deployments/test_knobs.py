from __future__ import annotations

import subprocess
import tomllib

import pytest

from specpilot.deployments import SpecPilotError
from specpilot.deployments.knobs import get_knob, set_knob

TEXT = """# knobs
[decode]
mode = "spec"        # stock
block_size = 8       # draft positions

[drafter]
max_ngram = 4
"""


def test_one_line_change_keeps_comments(tmp_path):
    p = tmp_path / "refspec.toml"
    p.write_text(TEXT)
    set_knob(p, "decode.block_size", 12)
    assert get_knob(p, "decode.block_size") == 12
    changed = [(a, b) for a, b in zip(TEXT.splitlines(), p.read_text().splitlines(), strict=True) if a != b]
    assert changed == [("block_size = 8       # draft positions", "block_size = 12       # draft positions")]


def test_strings_bools_floats_and_new_keys(tmp_path):
    p = tmp_path / "k.toml"
    p.write_text(TEXT)
    set_knob(p, "decode.mode", "ar")
    set_knob(p, "drafter.min_ngram", 2)  # absent: appended to its section
    set_knob(p, "decode.fast", True)  # absent, section followed by another
    data = tomllib.loads(p.read_text())
    assert data == {
        "decode": {"mode": "ar", "block_size": 8, "fast": True},
        "drafter": {"max_ngram": 4, "min_ngram": 2},
    }


def test_missing_section_is_an_error_and_file_untouched(tmp_path):
    p = tmp_path / "k.toml"
    p.write_text(TEXT)
    with pytest.raises(SpecPilotError, match=r"no \[runtime\] section"):
        set_knob(p, "runtime.threads", 2)
    assert p.read_text() == TEXT


def test_git_diff_is_one_line(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    p = tmp_path / "k.toml"
    p.write_text(TEXT)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    set_knob(p, "drafter.max_ngram", 3)
    stat = subprocess.run(
        ["git", "-C", str(tmp_path), "diff", "--numstat"], capture_output=True, text=True, check=True
    )
    assert stat.stdout.split()[:2] == ["1", "1"]
