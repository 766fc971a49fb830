"""A one-launch CUDA C++ pass of SmolLM2-135M (bench/refspec_mega*.cu) beside refspec's Triton persistent pass.

    python bench/refspec_mega.py [--kernel mega2] [--context 300] [--rows 1,9,16] --json OUT     # on the device

`--kernel mega` (refspec_mega.cu): the Triton pass's five phases a layer, each after a grid barrier;
`--kernel mega2` (refspec_mega2.cu): two a layer, clusters of 8 blocks meeting through distributed
shared memory inside a phase (that file's header says how).

The prototype of issue 40's next step: a warp's weights for the next phase are loaded into its
registers between its block's arrival at the grid barrier and its wait, so a phase after the barrier
reads only activations. Built here with nvcc (sm_90a) into a shared library and called through
ctypes (no torch extension build). On random weights of SmolLM2's shapes (refspec_floor.random_engine),
context 300, for each row count:
  - the Triton pass runs first (CudaModel.verify: its tokens and the final residual x), then this
    pass on the same inputs and cache: tokens equal, x's largest difference (bf16 ulps: the
    summation order differs);
  - this pass twice: the same bits; a chain row of the R-row pass = its one-row pass (the same
    token and x, to the bit);
  - device µs per pass of each, captured as a CUDA graph (refspec_floor.graph_us: 5 runs of 100
    replays, median), and µs per phase of this pass (the global timer as block 0 leaves each
    barrier, averaged over layers).
Each `--variants` entry is one build with its -D macros (refspec_mega.cu's header lists them).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {"mega": ROOT / "bench" / "refspec_mega.cu", "mega2": ROOT / "bench" / "refspec_mega2.cu"}


class Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("embed", "head", "norm", "ln1", "wqkv", "wo", "ln2", "wgu", "wd",
                                               "cos", "sin", "kc", "vc", "tokens", "posn", "start",
                                               "x", "q", "o", "h", "best", "out", "bar", "timeline", "part", "acnt")]  # fmt: skip
    _fields_ += [(n, ctypes.c_int) for n in ("R", "L", "S", "V")]
    _fields_ += [("eps", ctypes.c_float), ("qk_scale", ctypes.c_float)]
    _fields_ += [(n, ctypes.c_void_p) for n in ("po", "pd", "xa", "xb", "err")]  # mega2's own


# refspec_mega2.cu's steps of a layer in block 0 (`tick`): each names the work that ends at it
STEPS = ("stage_x", "qkv_push", "cluster_sync_qkv", "rope", "attention_push", "cluster_sync_attn", "combine",
         "o_proj", "grid_barrier_1", "stage_x_mid", "gate_up_push", "cluster_sync_gu", "silu", "down",
         "grid_barrier_2")  # fmt: skip

# a layer's phases (each ended by a grid barrier), and whether the embedding has its own
PHASES = {"mega": (("qkv", "attention", "o_proj", "gate_up", "down"), True),
          "mega2": (("attention_block", "mlp_block"), False)}  # fmt: skip


def build(src: Path, out_dir: Path, defines: list[str]) -> ctypes.CDLL:
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major == 9 else "")
    so = out_dir / f"{src.stem}{''.join(defines)}.so"
    cmd = ["nvcc", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-shared", "-Xcompiler", "-fPIC",
           "-Xptxas", "-v", *[f"-D{d}" for d in defines], "-o", str(so), str(src)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"refspec_mega: nvcc failed:\n{proc.stderr[-3000:]}")
    print("\n".join(ln for ln in proc.stderr.splitlines() if "registers" in ln or "spill" in ln))
    lib = ctypes.CDLL(str(so))
    lib.mega_pass.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_void_p]
    lib.mega_pass.restype = ctypes.c_int
    if hasattr(lib, "mega_blocks"):
        lib.mega_blocks.argtypes, lib.mega_blocks.restype = [], ctypes.c_int
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="mega")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rows", default="1,9,16")
    ap.add_argument(
        "--variants",
        default="CHUNK_ATTN+NO_FENCE+ROPE_EARLY+WIDE_COMBINE,CHUNK_ATTN+NO_FENCE+ROPE_EARLY+LAST_COMBINE",
        help="builds: -D macros joined by +, comma-separated (empty: as is)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT / "bench"))
    import torch  # noqa: I001  (refspec_floor puts the checkout's refspec on sys.path first)
    from refspec_floor import graph_us, random_engine
    from refspec import cuda_persist
    from refspec.cuda_graphs import PERSIST

    tmp = Path(tempfile.mkdtemp())
    src, (phases, embed_phase) = KERNELS[args.kernel], PHASES[args.kernel]
    libs = {v or "as_is": build(src, tmp, [d for d in v.split("+") if d]) for v in args.variants.split(",")}
    engine, prompts = random_engine(args.context, 1)
    m, ctx, a = engine.model, args.context, engine.model.args
    seq = (prompts[0] * 20)[: ctx + 40]
    m.prefill(seq[:ctx], 0)
    ln1, wqkv, wo, ln2, wgu, wd = m.stacked()
    dev = m.device
    bufs = {
        "x": torch.zeros(16, a.hidden, device=dev, dtype=torch.bfloat16),
        "q": torch.zeros(16, a.heads * a.head_dim, device=dev, dtype=torch.bfloat16),
        "o": torch.zeros(16, a.heads * a.head_dim, device=dev, dtype=torch.bfloat16),
        "h": torch.zeros(16, a.intermediate, device=dev, dtype=torch.bfloat16),
        "best": torch.zeros(16, device=dev, dtype=torch.int64),
        "out": torch.zeros(16, device=dev, dtype=torch.int64),
        "bar": torch.zeros(1, device=dev, dtype=torch.int32),
        "acnt": torch.zeros(16 * a.heads, device=dev, dtype=torch.int32),
        "part": torch.zeros(
            16 * a.heads * -(-m.slots // 32) * (a.head_dim + 2), device=dev, dtype=torch.float32
        ),
        "po": torch.zeros(a.heads, 16, a.hidden, device=dev, dtype=torch.float32),
        "pd": torch.zeros(16, 16, a.hidden, device=dev, dtype=torch.float32),
        "xa": torch.zeros(16, a.hidden, device=dev, dtype=torch.bfloat16),
        "xb": torch.zeros(16, a.hidden, device=dev, dtype=torch.bfloat16),
        "err": torch.zeros(1, device=dev, dtype=torch.int32),
    }
    timeline = torch.zeros(64 + 16 * a.layers, device=dev, dtype=torch.int64)
    grid = torch.cuda.get_device_properties(dev).multi_processor_count
    if args.kernel == "mega2":  # as many clusters of 8 as fit at once (the same build for every variant)
        grid = next(iter(libs.values())).mega_blocks()
        if grid < 0:
            sys.exit(f"refspec_mega2: no grid of >= 12 clusters of 8 blocks fits (CUDA error {-grid})")
    p = Params()
    for name, t in {"embed": m.embed, "head": m.head, "norm": m.norm, "ln1": ln1, "wqkv": wqkv, "wo": wo,
                    "ln2": ln2, "wgu": wgu, "wd": wd, "cos": m.cos, "sin": m.sin, "kc": m.kc, "vc": m.vc,
                    "tokens": m.tokens, "posn": m.posn, "start": m.start, **bufs}.items():  # fmt: skip
        setattr(p, name, t.data_ptr())
    p.L, p.S, p.V, p.eps, p.qk_scale = a.layers, m.slots, a.vocab, a.rms_eps, m.qk_scale

    def mega(lib, rows: int, trace: bool = False) -> None:
        p.R, p.timeline = rows, timeline.data_ptr() if trace else None
        err = lib.mega_pass(ctypes.byref(p), grid, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"mega_pass: CUDA error {err}")
        if not torch.cuda.is_current_stream_capturing() and bufs["err"].item():
            raise RuntimeError(
                "mega_pass: the pass refused its inputs (start + rows > slots, or too many attention chunks)"
            )

    def set_inputs(rows: int, at: int) -> list[int]:  # the Triton pass (a graph replay) fills m.inp too
        return m.verify(seq[at : at + rows], list(range(at, at + rows)), at, None)

    out: dict = {"device": torch.cuda.get_device_name(0), "kernel": args.kernel, "context": ctx, "grid": grid,
                 "rows": {}}  # fmt: skip
    for rows in [int(r) for r in args.rows.split(",")]:
        res: dict = {}
        n = -(-rows // 16) * 16
        set_inputs(rows, ctx)

        def triton_pass(n: int = n) -> None:
            m.bar.zero_()
            cuda_persist.launch(m, n, True, PERSIST)

        res["triton_us"] = statistics.median(graph_us(triton_pass, runs=5, per=100, warm=30))
        for name, lib in libs.items():
            v: dict = {}
            toks = set_inputs(rows, ctx)
            xt = m.x[:rows].float().clone()
            mega(lib, rows)
            torch.cuda.synchronize()
            mt, xm = bufs["out"][:rows].tolist(), bufs["x"][:rows].clone()
            v["tokens_equal_triton"] = toks == mt
            v["x_max_abs_diff"] = (xm.float() - xt).abs().max().item()
            v["x_max_abs"] = xt.abs().max().item()
            mega(lib, rows, trace=True)
            torch.cuda.synchronize()
            v["same_bits_twice"] = bool(torch.equal(xm, bufs["x"][:rows]))
            t, k0, nph = timeline.tolist(), int(embed_phase), len(phases)
            steps = [(t[k] - t[k - 1]) / 1e3 for k in range(1, k0 + nph * a.layers + 2)]
            v["phase_us"] = (
                ({"embed": steps[0]} if embed_phase else {})
                | {"head": steps[-1]}
                | {
                    ph: statistics.mean(steps[k0 + nph * i + j] for i in range(a.layers))
                    for j, ph in enumerate(phases)
                }
            )
            # mega2: block 0's steps within a layer (its SM clock, in the global timer's ns)
            if args.kernel == "mega2":
                ns_per_clock = (t[len(steps)] - t[0]) / max(1, t[63] - t[62])
                ticks = [t[64 + 16 * i : 64 + 16 * i + 16] for i in range(a.layers)]
                ticks = [row[:15] + [ticks[i + 1][0]] for i, row in enumerate(ticks[:-1])]
                v["step_ns"] = {
                    name: round(ns_per_clock * statistics.mean(row[k + 1] - row[k] for row in ticks), 1)
                    for k, name in enumerate(STEPS)
                }
            if rows > 1:  # a chain row = its AR step: row rows-1 again as a one-row pass at its position
                last = rows - 1
                m.tokens[:1] = m.tokens[last : last + 1].clone()
                m.posn[:1] = m.posn[last : last + 1].clone()
                m.start.fill_(ctx + last)
                mega(lib, 1)
                torch.cuda.synchronize()
                v["chain_row_equals_ar"] = (
                    bool(torch.equal(xm[last], bufs["x"][0])) and mt[last] == bufs["out"][0].item()
                )
            set_inputs(rows, ctx)
            v["mega_us"] = statistics.median(
                graph_us(lambda lib=lib, r=rows: mega(lib, r), runs=5, per=100, warm=30)
            )
            v["speedup"] = res["triton_us"] / v["mega_us"]
            res[name] = v
        out["rows"][rows] = res
        print(json.dumps({"rows": rows} | res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
