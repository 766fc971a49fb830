"""The token-forcing scorer's worker on a GPU slot (controller/scorer_worker.py), as a refspec GPU
deployment's Phase 0 and audit run it, against the in-process FP32 scorer on the CPU: a small
synthetic target (drawn bit for bit alike on both), a prompt and an output of its own vocabulary.
Skipped without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from specpilot.controller.scorer import RefspecScorer, scorer_for
from specpilot.controller.scorer_worker import WorkerScorer
from specpilot.deployments import Home, load_deployment

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
          "eos_token_id": 2, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096,
          "tie_word_embeddings": True, "rope_theta": 10000.0, "rms_norm_eps": 1e-06,
          "max_position_embeddings": 2048, "synthetic": {"seed": 7, "gain": 1.0, "row_spread": 2.0}}  # fmt: skip


def test_the_worker_on_a_gpu_scores_as_the_cpu_does(home, tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    h = Home.resolve(home)
    dep = load_deployment("wide-h200", h)
    assert dep.devices.slots[0].startswith("cuda")
    dep = dep.model_copy(update={"target": dep.target.model_copy(update={"model": str(folder)})})
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 4096, (700,), generator=g).tolist()  # past one 512-row chunk
    output = torch.randint(3, 4096, (64,), generator=g).tolist()
    here = RefspecScorer(str(folder), h.cache)
    cpu = here.score("r0", prompt, output)
    scorer = scorer_for(dep, h)
    assert isinstance(scorer, WorkerScorer)
    with scorer:
        gpu = scorer.score("r0", prompt, output)
        gap = scorer.logprob_gap(prompt, output[:5], output[5], cpu.argmax[5])
        worker = scorer._proc
    assert worker.poll() is not None  # gone with close(), its context with it
    assert len(gpu.argmax) == len(output) == len(gpu.margins)
    # FP32 on both, summed in other orders: the argmax agrees wherever it is not a near tie.
    lp_cpu = here.logprobs(prompt, output)
    top2 = lp_cpu.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1] > 1e-3).tolist()
    assert sum(clear) > len(output) // 2
    assert [a for a, c in zip(gpu.argmax, clear, strict=True) if c] == [
        a for a, c in zip(cpu.argmax, clear, strict=True) if c
    ]
    assert gpu.margins == pytest.approx(cpu.margins, abs=1e-3)
    assert gap == pytest.approx(here.logprob_gap(prompt, output[:5], output[5], cpu.argmax[5]), abs=1e-3)
