"""The refspec-tlv entry on refspec's CUDA path (SmolLM2-135M, bf16, CUDA graphs): output equals AR
token for token, the Q pass runs in graphs of its own on the 8-bit view's weights and shares the
target's KV cache without changing a committed slot. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from ..refspec.conftest import humaneval_prompts
from ..refspec.tree_entry import checkout_entry, engine_for, import_tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def cuda_tlv(tmp_path_factory):
    pkg = import_tree(
        checkout_entry(tmp_path_factory.mktemp("tlv") / "tree", "refspec-tlv"), "refspec_tlv_gpu"
    )
    from refspec_tlv_gpu.cuda_graphs import CudaModel
    from refspec_tlv_gpu.model import load_weights
    from refspec_tlv_gpu.weights import SMOLLM2, resolve_model

    model = CudaModel(*load_weights(resolve_model(SMOLLM2)), torch.device("cuda"), 4096)
    return pkg, model


def test_tlv_on_cuda_is_ar_token_for_token(cuda_tlv):
    pkg, model = cuda_tlv
    stock = engine_for(pkg, model, tree={"enabled": False}, tlv={"enabled": False})
    tlv = engine_for(pkg, model, tree={"nodes": 16})
    q = tlv.policy.q.q
    assert q.kc is model.kc and q.graphs is not model.graphs and q.graphs  # shared cache, own graphs
    assert not torch.equal(q.layers[0][1], model.layers[0][1])  # the 8-bit view's weights
    steps = {"chain": 0, "tlv": 0}
    for prompt in humaneval_prompts(4):
        ar, _ = pkg.generate.greedy(stock, prompt, NEW_TOKENS, mode="ar")
        chain, cs = pkg.generate.greedy(stock, prompt, NEW_TOKENS, mode="spec")
        out, ts = pkg.generate.greedy(tlv, prompt, NEW_TOKENS, mode="spec")
        assert chain == ar and out == ar
        steps["chain"] += cs.steps
        steps["tlv"] += ts.steps
    assert steps["tlv"] < steps["chain"]
    assert tlv.policy.q_agreed > 0.8 * tlv.policy.q_checked


def test_the_q_pass_leaves_committed_slots_as_they_were(cuda_tlv):
    pkg, model = cuda_tlv
    tlv = engine_for(pkg, model, tree={"nodes": 16})
    prompt = humaneval_prompts(1)[0]
    tlv.start(prompt, NEW_TOKENS, drafting=True)
    tlv.decode_step("spec", NEW_TOKENS)
    pos = tlv.pos
    kc, vc = model.kc[:, :, :pos].clone(), model.vc[:, :, :pos].clone()
    tlv.policy.propose(tlv, tlv.draft(), NEW_TOKENS)
    assert torch.equal(model.kc[:, :, :pos], kc) and torch.equal(model.vc[:, :, :pos], vc)
