"""Shared setup of the claude-backend tests: skip reasons, the fake API wired in, a real workspace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specpilot.agents.claude import sdk_missing
from specpilot.agents.protocol import PlanningContext
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.registry import SHIPPED
from specpilot.memory_store import open_memory
from specpilot.memory_store.workspace import Workspace
from specpilot.orchestrator import sealing


def skip_without_cli() -> pytest.MarkDecorator:
    """Skip (with the reason) where the SDK or the Bash sandbox it requires is missing."""
    reason = sdk_missing()
    if reason is None and shutil.which("bwrap") is None:
        reason = "bubblewrap (bwrap) is not installed: the Claude Code Bash sandbox needs it (apt-get install bubblewrap socat)"
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def tiny_spec(home: Home, name: str = "smollm-agent") -> str:
    """smollm-cpu shrunk to 2 requests of 16 tokens, so a quick paired run takes seconds, not minutes."""
    text = (SHIPPED / "smollm-cpu.toml").read_text()
    text = text.replace('name = "smollm-cpu"', f'name = "{name}"')
    text = text.replace("sets = { humaneval = 5, mtbench = 2 }", "sets = { humaneval = 2 }")
    text = text.replace("max_new_tokens = 64", "max_new_tokens = 16")
    home.deployments.mkdir(parents=True, exist_ok=True)
    (home.deployments / f"{name}.toml").write_text(text)
    return name


def world(tmp_path: Path, name: str | None = None):
    """(home, deployment, workspace, memory) with the built-in memory imported."""
    home = Home(tmp_path / "home")
    dep = load_deployment(tiny_spec(home, name) if name else "smollm-cpu", home)
    ws, _ = Workspace.init(home, dep)
    memory = open_memory(home)
    sealing.ensure_builtin(memory, dep)
    return home, dep, ws, memory


def planning_context(dep, ws, memory, past=()) -> PlanningContext:
    return PlanningContext(
        deployment=dep.name, engine=dep.engine, system_tree=ws.system_tree, system_entries=[],
        costmodel={"tau": 2.61, "c": 1.42, "speedup": 1.84, "largest": "kernel", "notes": [],
                   "factors": {"tree": 1.31, "kernel": 2.05, "outside": 1.02}},
        memory=sealing.memory_summary(memory, dep), past=list(past), slots=list(dep.devices.slots),
        knobs=sealing.knob_values(ws, "system", memory, dep), budget={"rounds_left": 0},
    )  # fmt: skip
