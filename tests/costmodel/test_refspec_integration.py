"""The cost model on the real refspec engine and SmolLM2 weights: record, profile, replay, report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specpilot.costmodel import measure, replay, run_profile
from specpilot.costmodel.runner import cached_record
from specpilot.deployments import Home, load_deployment
from specpilot.deployments.stock import stock_tree_path

STOCK = stock_tree_path("refspec")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (STOCK / "refspec" / "record.py").is_file(),
        reason="refspec's recorder and profiler have not landed",
    ),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """One request with repeated text (so the n-gram drafter matches), recorded and profiled once."""
    root = tmp_path_factory.mktemp("cm")
    home = Home.resolve(root / "home")
    requests = root / "req.jsonl"
    prompt = list(range(1000, 1030)) * 3
    requests.write_text(
        json.dumps({"id": "humaneval-0", "set": "humaneval", "input_ids": prompt, "max_new_tokens": 24})
        + "\n"
    )
    slot = f"cpu:{min(os.sched_getaffinity(0))}"
    path, records = cached_record(STOCK, slot, requests, home, model="smollm2-135m-instruct")
    prof = run_profile(STOCK, slot, requests, root / "profile.json", home)
    return home, requests, slot, path, records, prof


def test_recording_and_profile_agree(run) -> None:
    _, _, _, _, records, prof = run
    (rec,) = records
    assert len(rec.greedy) == 24 and len(rec.lattices) >= 24
    assert rec.block_size == prof.block_size
    # Stock verifies the top-1 chain: replaying the chain on the recording reproduces the engine's
    # own τ, as long as its speculative output equals its AR greedy tokens (exact on fp32 CPU).
    chain = replay(records, "chain", prof.block_size)
    assert chain.tau == pytest.approx(prof.tau, rel=1e-9)
    assert replay(records, "oracle", None).tau >= replay(records, "best_first", 64).tau >= chain.tau


def test_report_from_the_real_engine(run, tmp_path: Path) -> None:
    home, requests, slot, path, _, _ = run
    prof_file = tmp_path / "p.json"
    prof_file.write_text(json.dumps(run[5].to_dict()))
    report = measure(load_deployment("smollm-cpu"), home, profile=prof_file, record=path, system="stock")
    assert report.tau > 1 and report.c > 0 and report.speedup == pytest.approx(report.tau / report.c)
    assert report.f_tree >= 1 - 1e-9  # the best tree at the stock budget includes the chain
    assert report.f_kernel > 0 and report.f_outside > 0
    assert {c.name for c in report.classes} >= {"linear", "attention", "lm_head"}
    assert report.largest in ("tree", "kernel", "outside")
    json.dumps(report.to_dict())
