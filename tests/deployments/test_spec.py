from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpilot.deployments import (
    Deployment,
    SpecPilotError,
    deployment_files,
    load_deployment,
    load_deployment_file,
)
from specpilot.deployments.home import Home
from specpilot.deployments.registry import SHIPPED
from specpilot.deployments.workloads.sources import SETS

PAPER = {
    "qwen27b-h100",
    "qwen27b-h100-fp8-batch",
    "qwen4b-h100-batch",
    "gemma12b-h100-eagle3",
    "muse30b-h100",
    "qwen27b-rtx6000",
}


def test_every_shipped_spec_loads_and_is_named_after_its_file():
    files = deployment_files()
    assert {"smollm-cpu", "smollm-h200"} | PAPER <= set(files)
    for name in files:
        dep = load_deployment(name)
        assert dep.name == name


def test_every_shipped_spec_on_the_public_sets_can_make_a_draw_from_them():
    """A shipped spec judged on the public sets must find one draw's prompts there (each batch size
    takes its own), warm-ups too; else its first comparison stops with "a draw needs …"."""
    for name in deployment_files():
        dep = load_deployment(name)
        if dep.controller.prompts != "public":
            continue  # a composed pool is sized from the spec (controller/composed.py)
        for s, need in dep.draw_sizes.items():
            assert need <= SETS[s].count, (
                f"{name}: a draw needs {need} prompts of {s}, which holds {SETS[s].count}"
            )
        pool = sum(SETS[s].count for s in dep.draw_sizes)
        assert sum(dep.draw_sizes.values()) + dep.controller.warmup_requests <= pool, name


def test_embedded_default_is_refspec_on_two_cpu_slots():
    dep = load_deployment("smollm-cpu")
    assert (dep.engine, dep.stock.tree, dep.drafter.kind) == ("refspec", "refspec", "ngram")
    assert dep.devices.slots == ["cpu:0", "cpu:1"]
    assert dep.serving.shape == "single"
    assert dep.target.arch.vocab == 49152


def test_paper_shapes_match_the_gemms_it_times():
    a = load_deployment("qwen27b-h100").target.arch
    # qkv 10240x5120, o 5120x8192, gate_up 34816x5120, down 5120x17408 (shared/anchors)
    assert (a.heads + 2 * a.kv_heads) * a.head_dim == 10240
    assert a.heads * a.head_dim == 8192
    assert 2 * a.intermediate == 34816
    assert (a.layers, a.gdn_layers, a.vocab) == (64, 48, 248320)
    assert load_deployment("qwen27b-h100-fp8-batch").serving.batch_sizes == [16, 24]


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / f"{name}.toml"
    p.write_text(text)
    return p


def _base_text() -> str:
    return (SHIPPED / "smollm-cpu.toml").read_text()


def test_syntax_error_names_the_file(tmp_path):
    p = _write(tmp_path, "smollm-cpu", _base_text() + "\n[broken\n")
    with pytest.raises(SpecPilotError, match=r"smollm-cpu\.toml: TOML syntax error"):
        load_deployment_file(p)


def test_mistyped_field_is_named(tmp_path):
    p = _write(tmp_path, "smollm-cpu", _base_text().replace("block_size = 8", "blok_size = 8"))
    with pytest.raises(SpecPilotError, match=r"field `drafter.blok_size`: unknown field"):
        load_deployment_file(p)


def test_missing_field_is_named(tmp_path):
    p = _write(tmp_path, "smollm-cpu", _base_text().replace('engine = "refspec"\n', ""))
    with pytest.raises(SpecPilotError, match=r"field `engine`: missing required field"):
        load_deployment_file(p)


def test_wrong_type_and_bad_slot_are_named(tmp_path):
    p = _write(tmp_path, "smollm-cpu", _base_text().replace("max_new_tokens = 64", 'max_new_tokens = "lots"'))
    with pytest.raises(SpecPilotError, match=r"field `workload.max_new_tokens`: .*integer"):
        load_deployment_file(p)
    p = _write(tmp_path, "smollm-cpu", _base_text().replace('"cpu:1"', '"gpu1"'))
    with pytest.raises(SpecPilotError, match=r"field `devices.slots`: .*'gpu1'.*'cpu:N' or 'cuda:N'"):
        load_deployment_file(p)


def test_slot_kind_must_match_device(tmp_path):
    p = _write(tmp_path, "smollm-cpu", _base_text().replace('"cpu:1"', '"cuda:1"'))
    with pytest.raises(SpecPilotError, match=r"needs 'cpu:N' slots"):
        load_deployment_file(p)


def test_paired_design_follows_the_slots_and_a_wrong_one_is_named(tmp_path):
    assert load_deployment("smollm-cpu").design == "sliced"
    assert load_deployment("smollm-h200").design == "interleaved"
    gpu = (SHIPPED / "smollm-h200.toml").read_text()
    p = _write(tmp_path, "smollm-h200", gpu.replace("[controller]", '[controller]\ndesign = "sliced"'))
    with pytest.raises(SpecPilotError, match=r"design 'sliced' needs CPU slots"):
        load_deployment_file(p)
    p = _write(tmp_path, "smollm-h200", gpu.replace("[controller]", '[controller]\ndesign = "swapped"'))
    with pytest.raises(SpecPilotError, match=r"design 'swapped' needs two slots"):
        load_deployment_file(p)
    one = (
        _base_text().replace(', "cpu:1"', "").replace("[controller]", '[controller]\ndesign = "interleaved"')
    )
    assert load_deployment_file(_write(tmp_path, "smollm-cpu", one)).design == "interleaved"


def test_cgroups_are_required_unless_a_deployment_opts_out_by_name(tmp_path):
    """Judging without cgroups is a per-deployment choice, spelled out; nothing else is accepted."""
    assert load_deployment("smollm-cpu").controller.cgroups == "required"
    assert load_deployment("qwen27b-h100").controller.cgroups == "required"
    assert load_deployment("smollm-h200").controller.cgroups == "optional"  # the lent H200 has none
    text = _base_text().replace("[controller]", '[controller]\ncgroups = "sometimes"')
    with pytest.raises(SpecPilotError, match=r"controller\.cgroups.*'required' or 'optional'"):
        load_deployment_file(_write(tmp_path, "smollm-cpu", text))


def test_name_must_match_file(tmp_path):
    p = _write(tmp_path, "other", _base_text())
    with pytest.raises(SpecPilotError, match=r"must match the file name 'other'"):
        load_deployment_file(p)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(SpecPilotError, match=r"unknown deployment 'nope'; known: .*smollm-cpu"):
        load_deployment("nope")


def test_user_spec_shadows_shipped(tmp_path):
    home = Home(tmp_path)
    home.deployments.mkdir(parents=True)
    _write(home.deployments, "smollm-cpu", _base_text().replace("max_new_tokens = 64", "max_new_tokens = 32"))
    assert "max_new_tokens = 64" in _base_text()
    assert load_deployment("smollm-cpu", home).workload.max_new_tokens == 32
    assert load_deployment("smollm-cpu").workload.max_new_tokens == 64


def test_json_round_trip():
    dep = load_deployment("qwen27b-rtx6000")
    again = Deployment.model_validate(json.loads(dep.model_dump_json()))
    assert again == dep
    assert dep.engine_flags["attention-backend"] == "triton"
