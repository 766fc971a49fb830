"""refspec test setup: the stock tree's package, the cached SmolLM2 folder, one CPU engine, prompts."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specpilot.deployments.stock import import_refspec, stock_tree_path

refspec = import_refspec()

from refspec.config import load_config  # noqa: E402  (importable once the stock tree is on sys.path)
from refspec.generate import Engine  # noqa: E402
from refspec.model import load_model  # noqa: E402
from refspec.tokenizer import load_tokenizer  # noqa: E402
from refspec.weights import SMOLLM2, resolve_model  # noqa: E402

TREE = stock_tree_path("refspec")
# One compute thread, as on a serving slot: the machine is shared and the engine is single-core.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def folder() -> Path:
    """The converted SmolLM2-135M-Instruct HF folder in the shared cache."""
    return resolve_model(SMOLLM2)


@pytest.fixture(scope="session")
def tokenizer(folder: Path):
    return load_tokenizer(folder)[0]


@pytest.fixture(scope="session")
def model(folder: Path):
    """The CPU fp32 model with the stock knobs' weight layout."""
    return load_model(folder, torch.device("cpu"), torch.float32, load_config().runtime.cpu_layout)


@pytest.fixture(scope="session")
def engine(model) -> Engine:
    return Engine(model, load_config())


@functools.cache
def humaneval_prompts(n: int) -> list[list[int]]:
    """Token ids of the first n HumanEval prompts of the smollm-cpu workload (CONTRACTS §6)."""
    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.workloads import load_requests, request_file

    home = Home.resolve(os.environ.get("SPECPILOT_HOME"))
    requests = load_requests(request_file(load_deployment("smollm-cpu"), home))
    return [r.input_ids for r in requests if r.set == "humaneval"][:n]


def refspec_env() -> dict[str, str]:
    """Environment of a refspec subprocess: the stock tree on PYTHONPATH, the shared cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(TREE) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_module(
    module: str, *args: str, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """`python -m refspec.<module> ...` in a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", f"refspec.{module}", *args],
        capture_output=True,
        text=True,
        env=env or refspec_env(),
        timeout=timeout,
        cwd=TREE,
    )
