"""Running a tree's own profiler/recorder on a slot: placement, atomic output, failures.

The tree here is a small one of our own that speaks the CONTRACTS §4/§5 command lines and reports
what the runner gave it (its CPU affinity, PYTHONPATH, CUDA_VISIBLE_DEVICES): what is under test is
the runner. The real refspec tools are exercised in test_refspec_integration.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specpilot.costmodel.runner import cached_record, run_profile, run_record
from specpilot.deployments import Home, SpecPilotError

from .builders import humaneval_record, profile_dict

TOOL = """
import argparse, json, os, sys
ap = argparse.ArgumentParser()
ap.add_argument("--device"); ap.add_argument("--requests"); ap.add_argument("--out")
ap.add_argument("--max-requests", type=int); ap.add_argument("--model")
a = ap.parse_args()
seen = {"affinity": sorted(os.sched_getaffinity(0)), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "path0": os.environ["PYTHONPATH"].split(os.pathsep)[0], "device": a.device,
        "max_requests": a.max_requests, "model": a.model, "requests": a.requests}
"""


def protocol_tree(root: Path, profile_body: str, record_body: str) -> Path:
    pkg = root / "refspec"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "profile.py").write_text(TOOL + profile_body)
    (pkg / "record.py").write_text(TOOL + record_body)
    return root


PROFILE_OK = f"""
data = {profile_dict()!r}
data["seen"] = seen
open(a.out, "w").write(json.dumps(data))
"""
RECORD_OK = f"""
open(os.path.join(os.path.dirname(__file__), "..", "..", "calls.txt"), "a").write("x")
open(a.out, "w").write(json.dumps({humaneval_record()!r}) + "\\n")
"""
FAIL = """
open(a.out, "w").write("half")
print("model weights not found under the cache", file=sys.stderr)
sys.exit(3)
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    return Home.resolve(tmp_path / "home")


@pytest.fixture
def requests(tmp_path: Path) -> Path:
    path = tmp_path / "req.jsonl"
    path.write_text(
        json.dumps({"id": "humaneval-0", "set": "humaneval", "input_ids": [1], "max_new_tokens": 12}) + "\n"
    )
    return path


def test_profile_runs_pinned_with_the_tree_first(tmp_path: Path, home: Home, requests: Path) -> None:
    tree = protocol_tree(tmp_path / "tree", PROFILE_OK, RECORD_OK)
    core = min(os.sched_getaffinity(0))
    out = tmp_path / "runs" / "profile.json"
    prof = run_profile(tree, f"cpu:{core}", requests, out, home, max_requests=2, model="wide27b-8l")
    seen = prof.extra["seen"]
    assert seen["affinity"] == [core] and seen["device"] == f"cpu:{core}" and seen["model"] == "wide27b-8l"
    assert seen["cuda"] == "" and Path(seen["path0"]) == tree.resolve()
    assert seen["max_requests"] == 2 and Path(seen["requests"]) == requests.resolve()
    assert prof.tau == 4.25
    assert sorted(p.name for p in out.parent.iterdir()) == ["profile.json", "profile.json.log"]


def test_a_cuda_slot_sees_only_its_gpu(tmp_path: Path, home: Home, requests: Path) -> None:
    tree = protocol_tree(tmp_path / "tree", PROFILE_OK, RECORD_OK)
    prof = run_profile(tree, "cuda:3", requests, tmp_path / "p.json", home)
    assert prof.extra["seen"]["cuda"] == "3" and prof.extra["seen"]["device"] == "cuda:0"


def test_a_crash_leaves_no_output(tmp_path: Path, home: Home, requests: Path) -> None:
    tree = protocol_tree(tmp_path / "tree", FAIL, FAIL)
    out = tmp_path / "runs" / "rec.jsonl"
    with pytest.raises(
        SpecPilotError, match="refspec.record on cpu:.* failed \\(exit 3.*model weights not found"
    ):
        run_record(tree, f"cpu:{min(os.sched_getaffinity(0))}", requests, out, home)
    assert sorted(p.name for p in out.parent.iterdir()) == ["rec.jsonl.log"]


def test_recordings_are_cached_by_tree_and_requests(tmp_path: Path, home: Home, requests: Path) -> None:
    tree = protocol_tree(tmp_path / "tree", PROFILE_OK, RECORD_OK)
    slot = f"cpu:{min(os.sched_getaffinity(0))}"
    path1, recs1 = cached_record(tree, slot, requests, home, model="m")
    path2, recs2 = cached_record(tree, slot, requests, home, model="m")
    assert path1 == path2 and (tmp_path / "calls.txt").read_text() == "x"
    assert [r.greedy for r in recs1] == [r.greedy for r in recs2]
    (tree / "refspec" / "drafter.py").write_text("# a patch changes the tree\n")
    path3, _ = cached_record(tree, slot, requests, home, model="m")
    assert path3 != path1 and (tmp_path / "calls.txt").read_text() == "xx"


@pytest.mark.parametrize(
    ("slot", "message"),
    [("cpu:100000", "not available"), ("gpu:0", "not of the form"), ("cpu:0", "not a refspec tree")],
)
def test_bad_slots_and_trees(tmp_path: Path, home: Home, requests: Path, slot: str, message: str) -> None:
    tree = tmp_path / "empty"
    tree.mkdir()
    if message != "not a refspec tree":
        tree = protocol_tree(tmp_path / "tree", PROFILE_OK, RECORD_OK)
    with pytest.raises(SpecPilotError, match=message):
        run_profile(tree, slot, requests, tmp_path / "p.json", home)
