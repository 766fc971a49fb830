"""A warp's GEMV for 1-16 activation rows on CUDA cores and on tensor cores (bench/mma_gemv.cu).

    python bench/mma_gemv.py [--rows 1,9,16] --json OUT     # on the device

The question for refspec's one-launch pass (bench/refspec_mega2.cu, issue 40): its GEMVs are
CUDA-core dots, so a 9-row verify pass costs ~4x a one-row pass. With tensor-core tiles
(mma.m16n8k16, the rows padded to 16) a warp's latency should not grow with the rows, and a row's
bits should not depend on the row count (the chain-row = AR-step guarantee). For K = 576
(SmolLM2's hidden size), weights in registers before the clock starts, activations in shared
memory, 132 blocks of 8 warps: SM clocks a warp (median and 90th percentile over warps) for
  core: 3 weight rows a warp (refspec_mega2.cu's QKV dots; and its one-row build, at one row),
  mma:  8 weight rows a warp, its 36 K steps in 1, 2 or 4 interleaved accumulator chains, the
        activations' fragments by 32-bit loads or ldmatrix; or swapped (the weights as A, 16 rows
        a warp, the activations as B's 8 columns: up to 8 rows);
each checked against an fp64 product (largest error over the largest |y|), and a row of a 9- or
16-row call against the one-row call of that row (to the bit).
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

SRC = Path(__file__).resolve().parent / "mma_gemv.cu"
WAYS = {"core (3 rows a warp)": (0, 3), "core, one-row build": (3, 3), "mma, 1 chain (8 rows a warp)": (1, 8),
        "mma, 2 chains": (2, 8), "mma, 4 chains": (4, 8), "mma, ldmatrix, 1 chain": (8, 8),
        "mma, ldmatrix, 2 chains": (9, 8), "mma, swapped (W as A, 16 rows a warp; <= 8 rows)": (10, 16)}  # fmt: skip
K, BLOCKS, WARPS = 576, 132, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,9,16")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major == 9 else "")
    so = Path(tempfile.mkdtemp()) / "mma_gemv.so"
    cmd = ["nvcc", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-shared", "-Xcompiler", "-fPIC",
           "-o", str(so), str(SRC)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"mma_gemv: nvcc failed:\n{proc.stderr[-3000:]}")
    lib = ctypes.CDLL(str(so))
    lib.gemv.restype = ctypes.c_int
    lib.gemv.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(16, K, generator=g)).to(torch.bfloat16).cuda()
    out: dict = {"device": torch.cuda.get_device_name(0), "K": K, "blocks": BLOCKS, "ways": {}}

    def run(which: int, per_warp: int, xr: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        n = w.shape[0]
        y = torch.zeros(16, n, device="cuda")
        cyc = torch.zeros(BLOCKS * WARPS, dtype=torch.int64, device="cuda")
        err = lib.gemv(
            which, xr.data_ptr(), w.data_ptr(), y.data_ptr(), cyc.data_ptr(), xr.shape[0], n, BLOCKS
        )
        if err:
            raise RuntimeError(f"gemv: CUDA error {err}")
        torch.cuda.synchronize()
        return y[: xr.shape[0]], cyc.tolist()

    for name, (which, per_warp) in WAYS.items():
        n = per_warp * WARPS * BLOCKS
        w = (torch.randn(n, K, generator=g) / K**0.5).to(torch.bfloat16).cuda()
        res: dict = {}
        for rows in [int(r) for r in args.rows.split(",")]:
            if (which == 3 and rows > 1) or (which == 10 and rows > 8):  # (one row only; 8 rows at most)
                continue
            xr = x[:rows].contiguous()
            for _ in range(3):  # warm (clocks, instruction cache)
                y, cyc = run(which, per_warp, xr, w)
            ref = xr.double() @ w.double().T
            v = {
                "cycles_median": statistics.median(cyc),
                "cycles_p90": sorted(cyc)[int(0.9 * len(cyc))],
                "err_over_max": ((y.double() - ref).abs().max() / ref.abs().max()).item(),
            }
            if rows > 1:  # each checked row of this call against its one-row call, to the bit
                v["row_equals_one_row_call"] = all(
                    torch.equal(y[r], run(which, per_warp, xr[r : r + 1].contiguous(), w)[0][0])
                    for r in sorted({0, rows // 2, rows - 1})
                )
            res[rows] = v
        out["ways"][name] = res
        print(json.dumps({name: res}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
