"""refspec's persistent CUDA pass compiled for Hopper on a machine without a GPU: registers, spills,
shared memory and the load mix, before a device call is spent on a variant.

    pip install --no-deps --target /tmp/tritonlib triton==3.6.0      # the device's Triton, once
    PYTHONPATH=/tmp/tritonlib python bench/refspec_ptx.py [--stages 4] [--warps 4] [--tree DIR] [--json OUT]

Triton compiles `cuda_persist.decode_pass` (SmolLM2-135M's shapes, 132 programs, the shipped tiles
unless overridden) to PTX for sm_90a, with pointers and the row count specialized as the JIT
specializes them on the device (16-byte aligned), and the wheel's own `ptxas -v` reports registers
per thread and spill bytes. A variant that spills or needs more shared memory than an SM has is
seen here in seconds; its speed still needs the device (bench/refspec_floor.py --sweep).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Pointer arguments' element types (the rest are bf16); int arguments the device sees as multiples of 16.
POINTERS = {"tok_ptr": "*i32", "posn_ptr": "*i32", "start_ptr": "*i32", "mask_ptr": "*i32", "cos_ptr": "*fp32",
            "sin_ptr": "*fp32", "val_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "bar_ptr": "*i32",
            "pm_ptr": "*fp32", "pl_ptr": "*fp32", "pacc_ptr": "*fp32", "cnt_ptr": "*i32"}  # fmt: skip
ALIGNED_INTS = ("R", "S_MAX", "MASK_STRIDE", "V", "TILES", "MAXS")
FLOATS = ("eps", "qk_scale")
MEMORY_OPS = re.compile(
    r"\b(ld\.global[.\w]*|st\.global[.\w]*|cp\.async\.c[ag]|prefetch\.global\.L[12]|mma\.sync)"
)


def compile_pass(tree: Path, stages: int | None, warps: int | None) -> dict:
    sys.path.insert(0, str(tree))
    import triton
    from refspec import cuda_persist
    from refspec.cuda_graphs import PERSIST
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cfg = dict(PERSIST)
    shipped_warps, shipped_stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    num_warps, num_stages = warps or shipped_warps, stages or shipped_stages
    const = dict(L=30, HQ=9, HK=3, D=64, HID=576, INTER=1536, BM=16, NP=132, LOGITS=True, HIDP=1024,
                 BT=triton.next_power_of_2(triton.cdiv(49152, cfg["HBN"])), SKIP=0, **cfg)  # fmt: skip
    names = list(inspect.signature(cuda_persist.decode_pass.fn).parameters)
    sig = {n: "constexpr" if n in const else POINTERS.get(n, "*bf16") if n.endswith("_ptr") else
           "fp32" if n in FLOATS else "i32" for n in names}  # fmt: skip
    aligned = [
        i for i, n in enumerate(names) if sig[n] != "constexpr" and (n.endswith("_ptr") or n in ALIGNED_INTS)
    ]
    src = ASTSource(fn=cuda_persist.decode_pass, signature=sig,
                    constexprs={(names.index(k),): v for k, v in const.items() if k in names},
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})  # fmt: skip
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": num_warps, "num_stages": num_stages})  # fmt: skip
    ptx = kernel.asm["ptx"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.ptx").write_text(ptx)
        info = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip
    num = lambda pattern: int(m.group(1)) if (m := re.search(pattern, info)) else None  # noqa: E731
    return {"tree": str(tree), "num_warps": num_warps, "num_stages": num_stages,
            "registers": num(r"Used (\d+) registers"), "spill_stores_bytes": num(r"(\d+) bytes spill stores"),
            "spill_loads_bytes": num(r"(\d+) bytes spill loads"), "shared_bytes": kernel.metadata.shared,
            "ptx_memory_ops": dict(sorted(collections.Counter(MEMORY_OPS.findall(ptx)).items()))}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT / "deployments" / "stock" / "refspec",
                    help="the folder holding the refspec package (a variant's copy)")  # fmt: skip
    ap.add_argument("--stages", type=int, help="num_stages (default: the shipped PERSIST)")
    ap.add_argument("--warps", type=int, help="num_warps (default: the shipped PERSIST)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("refspec_ptx: Triton is not installed; see this script's docstring for the one-line install")
    out = compile_pass(args.tree.resolve(), args.stages, args.warps)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
