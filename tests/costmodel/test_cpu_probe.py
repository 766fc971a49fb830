"""The CPU probe: a real pinned subprocess, cached by CPU model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specpilot.costmodel import device_spec
from specpilot.costmodel.cpu_probe import cpu_model, run_probe
from specpilot.deployments import Home, SpecPilotError, load_deployment


def test_probe_measures_once_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    home = Home.resolve(tmp_path / "home")
    dep = load_deployment("smollm-cpu")
    spec = device_spec(dep, home)
    assert spec.source == "probe" and cpu_model() in spec.name
    # One core copies at least 100 MB/s and multiplies at least 100 MFLOP/s, even when shared.
    assert spec.bandwidth > 1e8 and spec.peak_flops("float32") > 1e8
    cache = tmp_path / "cache" / "costmodel" / "cpu-probe.json"
    entry = json.loads(cache.read_text())[f"{cpu_model()}|float32"]
    assert entry["core"] == int(dep.devices.slots[0].split(":")[1])
    before = cache.stat().st_mtime_ns
    again = device_spec(dep, home)  # from the cache: no second probe
    assert again == spec and cache.stat().st_mtime_ns == before
    with pytest.raises(SpecPilotError, match="no peak FLOP/s for dtype 'bfloat16'"):
        spec.peak_flops("bfloat16")


def test_probe_on_a_core_we_do_not_have() -> None:
    missing = max(os.sched_getaffinity(0)) + 64
    with pytest.raises(SpecPilotError, match=f"core {missing} is not available"):
        run_probe(missing, "float32")
