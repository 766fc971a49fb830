"""The cost model's tools (a system's own refspec.profile / refspec.record) run confined, as its
serve process does (controller.refspec_system.tool_jail through costmodel.runner.run_tool): the
tree at /system, the requests at /in, a fresh /out, the SpecPilot home out of sight. A tool of our
own reports what it could see and do; the host checks the other side. Skipped, saying so, where the
machine cannot confine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specpilot.controller.refspec_system import tool_jail
from specpilot.costmodel.runner import run_tool
from specpilot.deployments import Home, SpecPilotError, load_deployment
from tests.controller.confinement import needs_confinement

pytestmark = needs_confinement

TOOL = r"""
import argparse, json, os, sys
ap = argparse.ArgumentParser()
ap.add_argument("--device"); ap.add_argument("--requests"); ap.add_argument("--out"); ap.add_argument("--model")
a = ap.parse_args()
seen = {"path0": os.environ["PYTHONPATH"].split(os.pathsep)[0], "cache": os.environ.get("SPECPILOT_CACHE"),
        "requests": open(a.requests).read(), "model": a.model, "module": os.path.dirname(__file__),
        "models": os.listdir(os.path.join(os.environ["SPECPILOT_CACHE"], "models"))}
def attempt(name, fn):
    try:
        fn()
        seen[name] = "ok"
    except OSError as e:
        seen[name] = type(e).__name__
attempt("read_home", lambda: os.listdir(sys.argv[-1]))
attempt("write_db", lambda: open(sys.argv[-1] + "/specpilot.db", "a").write("x"))
attempt("write_tree", lambda: open(os.path.join(os.path.dirname(__file__), "x.pyc"), "w").write("x"))
attempt("write_weights", lambda: open(os.path.join(os.environ["SPECPILOT_CACHE"], "models", a.model, "x"), "w"))
open(a.out, "w").write(json.dumps(seen))
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch):
    home = Home(tmp_path / "home")
    home.root.mkdir(parents=True)
    (home.root / "specpilot.db").write_text("verdicts")
    tree = tmp_path / "tree"
    (tree / "refspec").mkdir(parents=True)
    (tree / "refspec" / "__init__.py").write_text("")
    requests = tmp_path / "req.jsonl"
    requests.write_text('{"id": "humaneval-0", "input_ids": [1], "max_new_tokens": 4}\n')
    return home, tree, requests, load_deployment("smollm-cpu")


def test_a_tool_runs_confined_and_only_its_output_comes_back(world, tmp_path):
    home, tree, requests, dep = world
    (tree / "refspec" / "record.py").write_text(TOOL.replace("sys.argv[-1]", repr(str(home.root))))
    out = tmp_path / "runs" / "rec.json"
    slot = f"cpu:{min(os.sched_getaffinity(0))}"
    run_tool(
        "record", tree, slot, requests, ["--model", dep.target.model], out, home, 120, tool_jail(dep, home)
    )
    seen = json.loads(out.read_text())
    assert seen["path0"] == "/system" and seen["module"] == "/system/refspec" and seen["cache"] == "/cache"
    assert seen["requests"] == requests.read_text() and seen["model"] == dep.target.model
    assert seen["models"] == [dep.target.model], "the target's weights, nothing else of the cache"
    assert seen["read_home"] != "ok" and seen["write_db"] != "ok", "the SpecPilot home is out of reach"
    assert (home.root / "specpilot.db").read_text() == "verdicts"
    assert seen["write_tree"] != "ok" and not (tree / "refspec" / "x.pyc").exists(), "its tree is read-only"
    assert seen["write_weights"] != "ok"
    assert sorted(p.name for p in out.parent.iterdir()) == ["rec.json", "rec.json.log"], "no box left behind"


def test_a_confined_tool_that_fails_leaves_nothing_but_its_log(world, tmp_path):
    home, tree, requests, dep = world
    (tree / "refspec" / "record.py").write_text(
        "import sys\nprint('no weights here', file=sys.stderr)\nsys.exit(3)\n"
    )
    out = tmp_path / "runs" / "rec.json"
    slot = f"cpu:{min(os.sched_getaffinity(0))}"
    with pytest.raises(SpecPilotError, match=r"refspec.record on cpu:\d+ failed \(exit 3.*no weights here"):
        run_tool("record", tree, slot, requests, [], out, home, 120, tool_jail(dep, home))
    assert sorted(p.name for p in out.parent.iterdir()) == ["rec.json.log"]
