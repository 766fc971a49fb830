"""Every shipped SGLang deployment launches with flags SGLang 0.5.20 itself defines.

The flags are checked against the server arguments declared in the real stock tree (the pinned
wheel, materialized into the cache; `pip download` on the first run), read statically because
importing SGLang needs its GPU dependencies. Nothing here starts a server.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specpilot.controller.sglang_launch import command, scorer_flags, system_flags
from specpilot.controller.slots import Slot
from specpilot.deployments import Home, SpecPilotError, deployment_files, load_deployment
from specpilot.deployments.stock.wheel import LAUNCH_FILE, LAUNCH_TEMPLATE
from specpilot.memory_store import stock_for

from .sglang_server_args import check_command, server_flags

SGLANG_DEPLOYMENTS = [n for n in deployment_files() if load_deployment(n).engine == "sglang"]
GPU = Slot("cuda", 0)


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    return stock_for(load_deployment("qwen27b-h100"), Home(tmp_path_factory.mktemp("home"))).path


@pytest.fixture(scope="module")
def flags(stock):
    return server_flags(stock)


def _algorithms(stock: Path) -> set[str]:
    """The built-in members of SGLang's SpeculativeAlgorithm enum."""
    tree = ast.parse((stock / "python/sglang/srt/speculative/spec_info.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    return {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def _args(cmd: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    rest = cmd[3:]
    for i, a in enumerate(rest):
        if a.startswith("--"):
            out[a[2:]] = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else True
    return out


def _ar_tree(tmp: Path) -> Path:
    tmp.mkdir(exist_ok=True)
    (tmp / LAUNCH_FILE).write_text(LAUNCH_TEMPLATE.replace('mode = "spec"', 'mode = "ar"'))
    return tmp


def test_the_parser_reads_the_real_declarations(flags):
    assert len(flags) > 300
    assert flags["--enable-fp32-lm-head"].switch and not flags["--speculative-dflash-block-size"].switch
    assert "triton" in flags["--attention-backend"].choices and "fp8" in flags["--quantization"].choices
    assert flags["--model"] == flags["--model-path"]  # an alias


@pytest.mark.parametrize("name", SGLANG_DEPLOYMENTS)
def test_shipped_deployment_flags_are_sglang_server_arguments(name, stock, flags, tmp_path):
    dep = load_deployment(name)
    spec = command(system_flags(dep, stock), GPU, 30000)
    ar = command(system_flags(dep, _ar_tree(tmp_path / "ar")), GPU, 30001)
    score = command(scorer_flags(dep), GPU, 30002)
    for cmd in (spec, ar, score):
        assert cmd[1:3] == ["-m", "sglang.launch_server"]
        assert check_command(cmd, flags) == []
    a = _args(spec)
    assert a["speculative-algorithm"] in _algorithms(stock)
    assert a["model-path"] == dep.target.model and a["speculative-draft-model-path"] == dep.drafter.model
    assert (a["host"], a["port"], a["device"]) == ("127.0.0.1", "30000", "cuda")
    assert not any(k.startswith("speculative-") for k in _args(ar))
    s = _args(score)
    assert s["enable-fp32-lm-head"] is True and s["disable-radix-cache"] is True
    assert not any(k.startswith("speculative-") for k in s)
    for k, v in dep.engine_flags.items():  # passed verbatim, in AR and to the scorer too
        assert a[k] == str(v) and _args(ar)[k] == str(v) and s[k] == str(v)


def test_the_papers_settings(stock):
    def args(name: str) -> dict:
        return _args(command(system_flags(load_deployment(name), stock), GPU, 1))

    q = args("qwen27b-h100")
    assert (q["speculative-algorithm"], q["speculative-dflash-block-size"], q["dtype"]) == (
        "DFLASH",
        "8",
        "bfloat16",
    )
    assert "quantization" not in q
    fp8 = args("qwen27b-h100-fp8-batch")
    assert (fp8["quantization"], fp8["dtype"]) == ("fp8", "bfloat16")
    rtx = args("qwen27b-rtx6000")
    assert (rtx["speculative-dflash-block-size"], rtx["attention-backend"]) == ("12", "triton")
    g = args("gemma12b-h100-eagle3")
    assert (g["speculative-algorithm"], g["speculative-num-steps"], g["speculative-eagle-topk"],
            g["speculative-num-draft-tokens"]) == ("EAGLE3", "3", "1", "4")  # fmt: skip


def test_every_drafter_kind_maps_onto_real_arguments(stock, flags):
    base = load_deployment("qwen27b-h100")
    for kind, algorithm in (
        ("dflash2", "DFLASH"),
        ("dspark", "DSPARK"),
        ("eagle3", "EAGLE3"),
        ("ngram", "NGRAM"),
    ):
        dep = base.model_copy(update={"drafter": base.drafter.model_copy(update={"kind": kind, "top_k": 1})})
        cmd = command(system_flags(dep, stock), GPU, 1)
        assert check_command(cmd, flags) == [] and _args(cmd)["speculative-algorithm"] == algorithm
    tree = base.model_copy(update={"drafter": base.drafter.model_copy(update={"kind": "eagle3", "top_k": 4})})
    with pytest.raises(SpecPilotError, match="needs engine_flags.speculative-num-draft-tokens"):
        system_flags(tree, stock)
    no_draft = base.model_copy(update={"drafter": base.drafter.model_copy(update={"model": None})})
    with pytest.raises(SpecPilotError, match="drafter.model is required for a dflash2 drafter"):
        system_flags(no_draft, stock)


def test_a_launch_file_retune_reaches_the_command(stock, flags, tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / LAUNCH_FILE).write_text(
        LAUNCH_TEMPLATE
        + "speculative-dflash-block-size = 16\nmem-fraction-static = 0.8\nrandom-seed = false\n"
    )
    a = _args(command(system_flags(load_deployment("qwen27b-h100"), tree), GPU, 1))
    assert (a["speculative-dflash-block-size"], a["mem-fraction-static"]) == ("16", "0.8")
    assert "random-seed" not in a  # false drops a flag the deployment sets
    assert check_command(command(system_flags(load_deployment("qwen27b-h100"), tree), GPU, 1), flags) == []
