"""record (CONTRACTS §4) and profile (§5) on real runs, through their command lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refspec.drafter import Lattice
from refspec.generate import greedy

from .conftest import TREE, humaneval_prompts, run_module
from .kernel_names import kernel_class, launched

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("req") / "requests.jsonl"
    lines = [
        json.dumps(
            {"id": f"humaneval-{i}", "set": "humaneval", "input_ids": ids, "max_new_tokens": NEW_TOKENS}
        )
        for i, ids in enumerate(humaneval_prompts(2))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def replay_chain_steps(greedy_tokens: list[int], lattices: list[dict], block_size: int) -> int:
    """Steps of stock's top-1 chain by exact replay of the record (no target model)."""
    i = steps = 0
    while i < len(greedy_tokens):
        chain = [cands[0] for cands in lattices[i]["tokens"][:block_size]]
        accepted = 0
        while (
            accepted < len(chain)
            and i + accepted < len(greedy_tokens)
            and chain[accepted] == greedy_tokens[i + accepted]
        ):
            accepted += 1
        i += accepted + 1
        steps += 1
    return steps


def test_record_gives_greedy_tokens_and_a_lattice_per_prefix(tmp_path, requests_file, engine):
    out = tmp_path / "record.jsonl"
    proc = run_module("record", "--device", "cpu:0", "--requests", str(requests_file), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    requests = [json.loads(line) for line in requests_file.read_text().splitlines()]
    assert [r["id"] for r in records] == [r["id"] for r in requests]
    for rec, req in zip(records, requests, strict=True):
        assert rec["prompt_len"] == len(req["input_ids"])
        assert (rec["block_size"], rec["top_k"], rec["drafter"]) == (8, 16, "ngram")
        ar, _ = greedy(engine, req["input_ids"], NEW_TOKENS, "ar")
        assert rec["greedy"] == ar and len(rec["lattices"]) == NEW_TOKENS
        for i, lat in enumerate(rec["lattices"]):
            lattice = Lattice.from_json(lat)
            assert len(lattice.tokens) <= 8 and all(1 <= len(c) <= 16 for c in lattice.tokens)
            assert [len(c) for c in lattice.logp] == [len(c) for c in lattice.tokens]
            assert lattice.cond[:1] in ([], [{}])
            # The lattice is the drafter's for the prefix prompt + greedy[:i].
            engine.drafter.reset(req["input_ids"] + ar[:i])
            assert lattice == engine.drafter.draft(8, 16)
        # Exact replay of the chain policy gives the engine's own step count.
        spec, stats = greedy(engine, req["input_ids"], NEW_TOKENS, "spec")
        if spec == ar:
            assert replay_chain_steps(rec["greedy"], rec["lattices"], 8) == stats.steps


def test_profile_writes_the_contract_record(tmp_path, requests_file):
    out = tmp_path / "profile.json"
    proc = run_module(
        "profile",
        "--device",
        "cpu:0",
        "--requests",
        str(requests_file),
        "--out",
        str(out),
        "--max-requests",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    prof = json.loads(out.read_text())
    assert set(prof) == {
        "engine", "device", "dtype", "mode", "block_size", "rows_per_step", "steps", "tau",
        "step_wall_s", "ar_step_wall_s", "context_len", "classes", "profiled_s",
    }  # fmt: skip
    assert (prof["engine"], prof["device"], prof["dtype"], prof["mode"]) == (
        "refspec",
        "cpu:0",
        "float32",
        "spec",
    )
    assert set(prof["classes"]) == {"linear", "attention", "lm_head", "drafter", "other"}
    assert all(v > 0 for v in prof["classes"].values())
    assert prof["profiled_s"] == pytest.approx(sum(prof["classes"].values()))
    assert 1 <= prof["rows_per_step"] <= 9 and prof["tau"] == pytest.approx(NEW_TOKENS / prof["steps"])
    assert prof["step_wall_s"] > 0 and prof["ar_step_wall_s"] > 0
    prompt_len = len(json.loads(requests_file.read_text().splitlines()[0])["input_ids"])
    assert prompt_len < prof["context_len"] < prompt_len + NEW_TOKENS


def test_every_kernel_stock_launches_has_a_profile_class():
    """The CUDA profile classes a kernel's device time by `CudaModel.KERNEL_CLASS`; a kernel missing
    there would count as "other" and hide its bytes from the cost model."""
    cuda = TREE / "refspec" / "cuda_graphs.py"
    classes = kernel_class(cuda, "CudaModel")
    assert launched(cuda) == set(classes)
    assert set(classes.values()) <= {"linear", "attention", "lm_head"}
