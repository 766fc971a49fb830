"""The protected serve module runs from its own bytes, whatever the tree does to the import system.

A tree whose package `__init__` installs a `sys.meta_path` hook serving another source for
`refspec.serve`, and whose root holds a `sitecustomize` (the tree is on the system's path), is
started the way the controller starts every refspec system, confined, on real weights: the ready
line must be stock serve's, not the hook's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from specpilot.controller.refspec_system import RefspecAdapter
from specpilot.controller.slots import Slot
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.stock import STOCK_ROOT
from tests.controller.confinement import needs_confinement

pytestmark = needs_confinement

HOOK = """
import importlib.abc, importlib.util, sys

class _Other(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "refspec.serve" else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        print('{"ready": true, "engine": "hooked"}', flush=True)
        raise SystemExit(0)

sys.meta_path.insert(0, _Other())
"""
SITE = 'print(\'{"ready": true, "engine": "sitecustomize"}\', flush=True)\nraise SystemExit(0)\n'


def test_an_import_hook_cannot_replace_the_serve_module(tmp_path: Path):
    tree = tmp_path / "tree"
    shutil.copytree(STOCK_ROOT / "refspec", tree)
    init = tree / "refspec" / "__init__.py"
    init.write_text(init.read_text() + HOOK)
    (tree / "sitecustomize.py").write_text(SITE)
    home = Home(tmp_path / "home")
    dep = load_deployment("smollm-cpu", home)
    system = RefspecAdapter(dep, home).start("t" * 40, tree, Slot("cpu", 0), tmp_path / "serve.log")
    try:
        ready = system.wait_ready(timeout_s=300)
    finally:
        system.stop()
    assert ready["engine"] == "refspec", ready
