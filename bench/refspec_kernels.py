"""Tile sweep of refspec's fused CUDA kernels, and where a verification pass's time goes.

    python bench/refspec_kernels.py --json OUT [--context 300] [--rows 16]
    python bench/refspec_kernels.py --json OUT --pass-sweep 2 --rows 1 --context 264

On random weights of SmolLM2-135M's shapes (a kernel's time does not depend on the values): each
kernel of a layer timed alone for every candidate tile config (a CUDA graph of 30 back-to-back
launches, replayed; per-launch µs, median of 9), then the whole pass as the engine captures it
with the fastest config of each kernel, and a per-kernel profile of that pass (torch.profiler,
eager launches: kernel time without the graph's launch gaps).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deployments" / "stock" / "refspec"))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

GRID = {
    "QKV": [{"BH": 16, "BK": bk, "num_warps": w, "num_stages": 1} for bk in (64, 128, 256) for w in (2, 4, 8)],
    "ATTN": [{"BN": bn, "num_warps": w, "num_stages": s} for bn in (32, 64, 128) for w in (2, 4) for s in (1, 2, 3, 4)],
    "LIN_O": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 1} for bn in (16, 32) for bk in (64, 128, 256) for w in (2, 4, 8)],
    "LIN_DOWN": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 1} for bn in (16, 32) for bk in (128, 256, 512) for w in (2, 4, 8)],
    "GATE_UP": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 1} for bn in (16, 32, 64) for bk in (64, 128) for w in (2, 4, 8)],
    "HEAD": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 1} for bn in (64, 128, 256) for bk in (64, 128) for w in (4, 8)],
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--best", type=Path, help="take the best configs from an earlier sweep's JSON (no sweep)")
    ap.add_argument(
        "--pass-sweep",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: coordinate descent on the whole pass's graph replay (cold weights), ROUNDS rounds",
    )
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args()

    import torch
    import triton
    from refspec import cuda_graphs as G
    from refspec import cuda_kernels as K
    from test_refspec_cuda import SMOLLM2, random_state

    a = SMOLLM2
    m = G.CudaModel(a, random_state(a), torch.device("cuda"), max_context=4096)
    ctx, R = args.context, args.rows
    m.prefill(list(range(1000, 1000 + ctx)), 0)
    m.tokens[:R] = 5
    m.posn[:R] = torch.arange(ctx, ctx + R, dtype=torch.int32)
    m.start.fill_(ctx)
    m.mask[:R, :R] = torch.ones(R, R, dtype=torch.int32, device="cuda").tril()
    ln1, wqkv, wo, ln2, wgu, wd = m.layers[0]
    gm, group = triton.cdiv(R, G.BM), a.heads // a.kv_heads
    launch = {
        "QKV": lambda c: K.norm_qkv_rope[(a.heads + 2 * a.kv_heads, a.head_dim // 2 // c["BH"], gm)](
            m.x, ln1, wqkv, m.cos, m.sin, m.posn, m.start, m.q, m.kc[0], m.vc[0], R, a.rms_eps, m.slots,
            HQ=a.heads, HK=a.kv_heads, D=a.head_dim, K=a.hidden, BM=G.BM, **c),
        "ATTN": lambda c: K.attention[(a.heads, gm)](
            m.q, m.kc[0], m.vc[0], m.mask, m.start, m.o, R, m.rmax, m.slots, 1.4426950408889634 / math.sqrt(a.head_dim),
            HQ=a.heads, GROUP=group, D=a.head_dim, BM=G.BM, **c),
        "LIN_O": lambda c: K.linear_residual[(a.hidden // c["BN"], gm)](
            m.o, wo, m.x, R, N=a.hidden, K=a.heads * a.head_dim, BM=G.BM, **c),
        "LIN_DOWN": lambda c: K.linear_residual[(a.hidden // c["BN"], gm)](
            m.h, wd, m.x, R, N=a.hidden, K=a.intermediate, BM=G.BM, **c),
        "GATE_UP": lambda c: K.norm_gate_up[(a.intermediate // c["BN"], gm)](
            m.x, ln2, wgu, m.h, R, a.rms_eps, INTER=a.intermediate, K=a.hidden, BM=G.BM, **c),
        "HEAD": lambda c: K.norm_head[(triton.cdiv(a.vocab, c["BN"]), gm)](
            m.x, m.norm, m.head, m.vals, m.idxs, R, a.rms_eps, a.vocab, triton.cdiv(a.vocab, c["BN"]),
            K=a.hidden, BM=G.BM, **c),
    }  # fmt: skip

    def per_launch_us(fn) -> float:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(30):
                fn()
        g.replay()
        torch.cuda.synchronize()
        return 1e3 * replay_ms(g, 9, per=30)

    out: dict = {"device": torch.cuda.get_device_name(0), "context": ctx, "rows": R, "sweep": {}, "best": {}}
    if args.pass_sweep:
        out |= pass_sweep(m, R, ctx, args.pass_sweep, args.budget_s)
        print(json.dumps({k: out[k] for k in ("pass_ms_shipped", "pass_ms_best", "best")}, indent=1))
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        return
    if args.best:
        out["best"] = json.loads(args.best.read_text())["best"]
    for fam, configs in ({} if args.best else GRID).items():
        rows = []
        for c in configs:
            if fam.startswith("LIN") and (a.hidden % c["BN"]):
                continue
            try:
                us = per_launch_us(lambda c=c, fam=fam: launch[fam](c))
            except Exception as e:  # a config Triton cannot compile (shared memory, registers)
                rows.append({"config": c, "error": str(e).splitlines()[0][:200]})
                continue
            rows.append({"config": c, "us": us})
        ok = [r for r in rows if "us" in r]
        best = min(ok, key=lambda r: r["us"])
        default = getattr(G, fam)
        base = next((r["us"] for r in ok if r["config"] == default), None)
        out["sweep"][fam] = rows
        out["best"][fam] = {"config": best["config"], "us": best["us"], "default_us": base}
        print(f"{fam:9s} best {best['us']:6.2f} us {best['config']}  (current {base})", flush=True)

    out["pass_ms_current"] = pass_ms(m, R, ctx)
    for fam in GRID:
        getattr(G, fam).clear()
        getattr(G, fam).update(out["best"][fam]["config"])
    out["pass_ms_best"] = pass_ms(m, R, ctx)
    from torch.profiler import ProfilerActivity, profile

    m.eager = True
    m.verify([5] * R, list(range(ctx, ctx + R)), ctx, None)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            m.verify([5] * R, list(range(ctx, ctx + R)), ctx, None)
    per: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] = per.get(e.name, 0.0) + e.time_range.elapsed_us() / 5
    out["profile_us_per_pass"] = dict(sorted(per.items(), key=lambda kv: -kv[1]))
    m.eager = False
    out["variants"] = variants(m, R, ctx)
    print(json.dumps({k: out[k] for k in ("pass_ms_current", "pass_ms_best", "best")}, indent=1))
    print(json.dumps(dict(itertools.islice(out["profile_us_per_pass"].items(), 10)), indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def replay_times(g, n: int, per: int = 1) -> list[float]:
    """The times of `n` timed replays of CUDA graph `g` (ms, CUDA events), each divided by `per`."""
    import torch

    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / per)
    return ts


def replay_ms(g, n: int, per: int = 1) -> float:
    """Median time of one replay of CUDA graph `g` over `n` timed replays (ms), divided by `per`."""
    return statistics.median(replay_times(g, n, per))


def pass_ms(m, R: int, ctx: int, n: int = 30, warm_s: float = 0.3) -> float:
    """The whole pass of R rows at context `ctx`, captured afresh (the current tile configs) and
    replayed: `warm_s` seconds of replays first (the GPU idles at 345 MHz while Triton compiles),
    then the median of `n`."""
    import time

    import torch
    from refspec import cuda_graphs as G

    m.graphs.clear()
    m.capture(R)
    m.start.fill_(ctx)  # capture leaves `start` at the scratch slots past the capacity (context ~4k)
    g = m.graphs[(G.bucket(R), False)]
    warm = time.monotonic() + warm_s
    while time.monotonic() < warm:
        g.replay()
    torch.cuda.synchronize()
    return replay_ms(g, n)


# Values each parameter may take in the pass sweep (a config Triton cannot build is skipped).
PARAM_VALUES = {"BK": (64, 128, 256, 512), "BN": (16, 32, 64), "BH": (16, 32), "num_warps": (1, 2, 4, 8),
                "num_stages": (1, 2, 3, 4)}  # fmt: skip
FAMILY_VALUES = {"ATTN": {"BN": (32, 64, 128)}, "HEAD": {"BN": (64, 128, 256)}}


def pass_sweep(m, R: int, ctx: int, rounds: int, budget_s: float) -> dict:
    """Coordinate descent over the kernels' tile configs, judged on what the engine runs: the whole
    pass captured as one graph (30 layers, so every weight comes from HBM as in decoding), replayed;
    median of 40 replays after 0.3 s of them (pass_ms). One parameter of one family moves at a time; a move is kept when the pass
    gets faster by more than 1%."""
    import time

    from refspec import cuda_graphs as G

    t0 = time.monotonic()

    fams = ("QKV", "ATTN", "LIN_O", "LIN_DOWN", "GATE_UP", "HEAD")
    shipped = {f: dict(getattr(G, f)) for f in fams}
    best_ms = pass_ms(m, R, ctx, n=40)
    out = {"pass_ms_shipped": best_ms, "moves": []}
    for rnd in range(rounds):
        moved = False
        for fam in fams:
            cfg = getattr(G, fam)
            for param in list(cfg):
                for v in FAMILY_VALUES.get(fam, {}).get(param, PARAM_VALUES.get(param, ())):
                    if v == cfg[param] or time.monotonic() - t0 > budget_s:
                        continue
                    if fam in ("LIN_O", "LIN_DOWN") and param == "BN" and m.args.hidden % v:
                        continue
                    old = cfg[param]
                    cfg[param] = v
                    try:
                        ms = pass_ms(m, R, ctx, n=40)
                    except Exception as e:  # noqa: BLE001 - a config Triton cannot build (registers, shared memory)
                        out["moves"].append({"family": fam, param: v, "error": str(e).splitlines()[0][:160]})
                        cfg[param] = old
                        continue
                    out["moves"].append({"round": rnd, "family": fam, param: v, "pass_ms": ms})
                    if ms < 0.99 * best_ms:
                        best_ms, moved = ms, True
                        print(f"round {rnd} {fam} {param}={v}: {ms:.4f} ms", flush=True)
                    else:
                        cfg[param] = old
        if not moved:
            break
    out["best"] = {f: dict(getattr(G, f)) for f in fams}
    out["pass_ms_best"] = pass_ms(m, R, ctx, n=40)
    out["shipped"] = shipped
    out["sweep_s"] = time.monotonic() - t0
    return out


def variants(m, R: int, ctx: int) -> dict:
    """The reduction loops as plain loops (as shipped) and unrolled (a copy of the kernels with
    `range` → `static_range`), each pass's graph replay and the kernels' share of it (profiled
    inside the graph: the gaps between kernels are what the graph costs beyond them)."""
    import importlib.util
    import tempfile

    import torch
    from refspec import cuda_graphs as G
    from torch.profiler import ProfilerActivity, profile

    src = (
        (ROOT / "deployments/stock/refspec/refspec/cuda_kernels.py")
        .read_text()
        .replace("range(0, K, BK)", "tl.static_range(0, K, BK)")
    )
    path = Path(tempfile.mkdtemp()) / "cuda_kernels_unrolled.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("cuda_kernels_unrolled", path)
    unrolled = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unrolled)
    shipped, res = G.K, {}
    for name, mod, stages in (("loops", shipped, 3), ("unrolled", unrolled, 1)):
        G.K = mod
        for fam in ("QKV", "LIN_O", "LIN_DOWN", "GATE_UP", "HEAD"):
            getattr(G, fam)["num_stages"] = stages
        ms = pass_ms(m, R, ctx)
        g = m.graphs[(G.bucket(R), False)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
        ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.time_range.elapsed_us() for e in ks) / 3
        res[name] = {"pass_ms": ms, "kernels_seen": len(ks) // 3, "kernel_us_per_pass": busy}
        print(name, res[name], flush=True)
    G.K = shipped
    res["empty_kernel_us"] = _empty_kernel_us()
    return res


def _empty_kernel_us() -> float:
    """A graph of 150 launches of a kernel that writes one value: the floor of a launch in a graph."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def one(p):
        tl.store(p + tl.program_id(0), 1.0)

    buf = torch.zeros(64, device="cuda")
    one[(32,)](buf)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(150):
            one[(32,)](buf)
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / 1500


if __name__ == "__main__":
    main()
