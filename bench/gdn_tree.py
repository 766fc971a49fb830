"""GDN tree verification on one GPU: stock chain (snapshots) vs path vs WY kernels, and commit.

    python bench/gdn_tree.py --out bench/results/gdn_tree_h200.json            # 48 layers, 32 nodes

Qwen3.8-27B's GDN shape (16 key heads, 48 value heads, 128 x 128 fp32 state per head), random
bf16 tokens and states per layer (speed does not depend on the values). The draft tree is the
best-first tree (kernels/tree.py) of a lattice with top-4 candidates at probabilities
0.70/0.15/0.10/0.05 per position: bushy near the root, one long spine. Times are GPU time of all
layers' launches captured in one CUDA graph (median over replays, CUDA events), so launch
overhead is not counted; eager times (host launches included) are reported beside them.
Correctness on the same shapes: path on a chain and commit against stock's chain kernel and its
snapshots bit for bit, stock against fla-core's fused recurrent kernel where fla-core is
installed, and how far WY sits from path in bf16 ulps over every layer's outputs (reference.bf16_ulp_error).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from refspec_kernels import replay_times  # noqa: E402

H, HV, KD, VD = 16, 48, 128, 128
SCALE = KD**-0.5
PAPER_H100 = {"path_verify_us": 1485, "wy_verify_us": 542, "commit_path_us": 208, "commit_fast_us": 119}


def draft_tree(nodes: int) -> list[int]:
    from specpilot.kernels.tree import Lattice, best_first_tree

    probs = [0.70, 0.15, 0.10, 0.05]
    lat = Lattice(tokens=[list(range(4))] * 16, logp=[[math.log(p) for p in probs]] * 16)
    return best_first_tree(lat, nodes, conditioned=False).parents


def layer_inputs(layers: int, n: int, dev):
    gen = torch.Generator(device=dev).manual_seed(0)
    out = []
    for _ in range(layers):
        q = torch.randn(n, H, KD, generator=gen, device=dev).to(torch.bfloat16)
        k = torch.randn(n, H, KD, generator=gen, device=dev).to(torch.bfloat16)
        v = torch.randn(n, HV, VD, generator=gen, device=dev).to(torch.bfloat16)
        g = -torch.exp(torch.rand(HV, generator=gen, device=dev) * 2 - 1) * F.softplus(
            torch.randn(n, HV, generator=gen, device=dev) - 2
        )
        beta = torch.sigmoid(torch.randn(n, HV, generator=gen, device=dev)).to(torch.bfloat16)
        h0 = torch.randn(HV, KD, VD, generator=gen, device=dev) * 0.1
        out.append((q, k, v, g, beta, h0))
    return out


def gpu_us(fn, reps: int) -> dict:
    """Median GPU time of fn (all layers) in one CUDA graph, and its eager wall time."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = [ms * 1000 for ms in replay_times(graph, reps)]
    eager = []
    for _ in range(max(5, reps // 5)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        eager.append((time.perf_counter() - t0) * 1e6)
    return {"graph_us": round(statistics.median(times), 1), "graph_min_us": round(min(times), 1),
            "eager_us": round(statistics.median(eager), 1)}  # fmt: skip


def correctness(layers, tree, depth: int) -> dict:
    from specpilot.kernels.gdn import TreeLayout, bf16_ulp_error
    from specpilot.kernels.gdn import kernels as gk

    q, k, v, g, beta, h0 = layers[0]
    sub = [t[:depth].contiguous() for t in (q, k, v, g, beta)]
    o, snaps = gk.chain(*sub, h0, SCALE)
    chain_tree = gk.DeviceTree(TreeLayout.chain(depth), "cuda")
    path_ok = torch.equal(gk.path_verify(chain_tree, *sub, h0, SCALE), o)
    commit_ok = all(
        torch.equal(gk.commit(list(range(a)), *sub, h0, SCALE), snaps[a - 1]) for a in range(1, depth + 1)
    )
    fla_ok = None
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla
    except ImportError:
        fla = None
    if fla is not None:
        o_fla, ht = fla(*(t.unsqueeze(0) for t in sub[:3]), g=sub[3][None], beta=sub[4][None], scale=SCALE,
                        initial_state=h0[None], output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
        fla_ok = torch.equal(o, o_fla[0]) and torch.equal(snaps[-1], ht[0])
    errs = [bf16_ulp_error(gk.wy_verify(tree, *x, SCALE)[0], gk.path_verify(tree, *x, SCALE)) for x in layers]
    wy = {"scaled_max": max(e["scaled_max"] for e in errs), "own_within_1": min(e["own_within_1"] for e in errs),
          "bit_equal": min(e["bit_equal"] for e in errs), "own_max": max(e["own_max"] for e in errs)}  # fmt: skip
    return {"path_on_chain_bit_exact": path_ok, "commit_bit_exact": commit_ok, "chain_equals_fla_core": fla_ok,
            "wy_vs_path_ulp": wy}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--nodes", type=int, nargs="+", default=[32, 24])
    ap.add_argument("--chain", type=int, default=8, help="stock's chain length (draft positions verified)")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    from specpilot.kernels.gdn import TreeLayout, snapshot_bytes
    from specpilot.kernels.gdn import kernels as gk

    dev = torch.device("cuda:0")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": args.layers,
              "shape": {"key_heads": H, "value_heads": HV, "k": KD, "v": VD}, "paper_h100": PAPER_H100,
              "by_nodes": {}}  # fmt: skip
    import triton

    result["triton"] = triton.__version__
    # The kernels' own launchers with check=False; the outputs they allocate come from the CUDA
    # graph's pool, so a replay times the kernels alone.
    stock_layers = layer_inputs(args.layers, args.chain, dev)
    snap_buf = [torch.empty(args.chain, HV, KD, VD, device=dev) for _ in stock_layers]
    state_out = [torch.empty(HV, KD, VD, device=dev) for _ in stock_layers]

    def stock_verify():
        for x in stock_layers:
            gk.chain(*x, SCALE, check=False)

    def stock_commit():  # stock's commit: the accepted position's snapshot becomes the state
        for snaps, out in zip(snap_buf, state_out, strict=True):
            out.copy_(snaps[args.chain // 2])

    snap_stack = torch.stack(snap_buf)
    states_stack = torch.stack(state_out)

    def stock_commit_one_copy():  # the same with snapshots stacked over layers: one strided copy
        states_stack.copy_(snap_stack[:, args.chain // 2])

    result["stock_chain"] = {"positions": args.chain, "verify": gpu_us(stock_verify, args.reps),
                             "commit_copy": gpu_us(stock_commit, args.reps),
                             "commit_one_copy": gpu_us(stock_commit_one_copy, args.reps)}  # fmt: skip

    def tree_timings(n: int) -> dict:
        parents = draft_tree(n)
        layout = TreeLayout.of(parents)
        tree = gk.DeviceTree(layout, dev)
        layers = layer_inputs(args.layers, n, dev)
        accepted = torch.tensor(layout.paths[max(range(n), key=lambda i: layout.depth[i])], dtype=torch.int32,
                                device=dev)  # fmt: skip

        def path_verify():
            for x in layers:
                gk.path_verify(tree, *x, SCALE, check=False)

        def wy_verify(bv, warps):
            def run():
                for x in layers:
                    gk.wy_verify(tree, *x, SCALE, check=False, bv=bv, num_warps=warps)

            return run

        def commit():  # one launch per layer, as stock launches its kernels
            for x, out in zip(layers, state_out, strict=True):
                gk.commit(accepted, *x, SCALE, out=out, check=False)

        stacked = [torch.stack([x[i] for x in layers]) for i in range(6)]
        states_out = torch.empty_like(stacked[5])

        def commit_all():  # every layer's replay in one launch: commit needs nothing from the layer below
            gk.commit(accepted, *stacked, SCALE, out=states_out, check=False)

        commit_all()
        commit()
        same = all(torch.equal(states_out[i], state_out[i]) for i in range(args.layers))

        wy = {}
        for bv, warps in ((32, 4), (64, 4), (64, 8), (128, 4), (128, 8)):
            try:
                wy[f"bv{bv}_w{warps}"] = gpu_us(wy_verify(bv, warps), args.reps)
            except Exception as e:  # a config that does not compile is reported, not fatal
                wy[f"bv{bv}_w{warps}"] = {"error": str(e)[:200]}
        best = min((v["graph_us"], k) for k, v in wy.items() if "graph_us" in v)
        return {
            "parents": parents, "max_depth": layout.max_depth, "sum_depth": sum(layout.depth),
            "path_verify": gpu_us(path_verify, args.reps), "wy_verify": wy, "wy_best": best[1],
            "commit": gpu_us(commit, args.reps), "commit_one_launch": gpu_us(commit_all, args.reps),
            "commit_one_launch_bit_exact": same, "commit_path_length": accepted.numel(),
            "correctness": correctness(layers, tree, min(layout.max_depth, 8)),
        }  # fmt: skip

    for n in args.nodes:
        result["by_nodes"][str(n)] = tree_timings(n)
        print(
            json.dumps({n: {k: v for k, v in result["by_nodes"][str(n)].items() if k != "parents"}}),
            flush=True,
        )
    state_per_layer = HV * KD * VD * 4
    result["memory"] = {
        "snapshot_bytes_n24": snapshot_bytes(24, args.layers, HV, KD, VD),
        "committed_state_bytes": args.layers * state_per_layer,
        "path_extra_bytes_n24": 0,  # recomputed along each root path: no state beyond the committed one
        "wy_u_bytes_n24": args.layers * 24 * HV * VD * 4,  # the corrected values U the WY kernel writes
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("by_nodes",)}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
