"""Issue 41's kernel figures from one device call, gathered into one file.

    # on the device, in one call (~4 minutes):
    python bench/w12_stream.py --out DIR && python bench/certified_head.py gpu --out DIR --budget-s 120 \\
      && python bench/hf_w12.py --rounds 2 --json DIR/hf_w12.json
    python bench/w12_final.py DIR --json bench/results/w12_final_h200.json

Reads DIR/w12_stream.json (`bench/w12_stream.py`: per layer of the paper's four shapes, cuBLAS, the
W12 GEMM at M = 1 and 32 and a kernel that only reads the layer's W12 records, CUDA-graph replays
under do_bench's flush), DIR/certified_head_gpu.json (`bench/certified_head.py gpu`) and DIR/hf_w12.json
(`bench/hf_w12.py`), and writes:
- `m1`, `m32`: per layer, cuBLAS's µs over W12's (above 1: W12 is faster);
- `read_floor_bound`: per layer, cuBLAS's µs over the read-only kernel's at M = 1: no W12 kernel
  can beat it (the issue's 1.26 / 1.39 / 1.35 / 1.36 on an H200, 2026-12-01);
- `of_bound_m1`: m1 over that bound (the issue asks ≥ 0.95);
- `certified_head_per_call`: the bf16 head (cuBLAS + argmax) over the certified head, graph µs, at
  M = 1 on the 248,320 × 5120 head;
- `hf_w12_speedup`: HF Transformers' AR decode with W12 linears over bf16.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def gather(d: Path) -> dict:
    stream = json.loads((d / "w12_stream.json").read_text())
    head = json.loads((d / "certified_head_gpu.json").read_text())
    hf = json.loads((d / "hf_w12.json").read_text())
    us = lambda row, key: row[key]["dobench_us"]  # noqa: E731
    m1 = {r["layer"]: us(r, "cublas_m1") / us(r, "w12_m1") for r in stream["rows"]}
    m32 = {r["layer"]: us(r, "cublas_m32") / us(r, "w12_m32") for r in stream["rows"]}
    bound = {r["layer"]: us(r, "cublas_m1") / us(r, "read_w12_bytes") for r in stream["rows"]}
    v = max(t["V"] for t in head["timing"])
    call = next(t for t in head["timing"] if t["M"] == 1 and t["V"] == v)
    return {
        "device": stream["gpu"],
        "m1": m1,
        "m32": m32,
        "read_floor_bound": bound,
        "of_bound_m1": {n: m1[n] / bound[n] for n in m1},
        "certified_head_per_call": call["bf16_linear_argmax_us"] / call["cert_graph_us"],
        "certified_head": {
            k: call[k] for k in ("V", "bf16_linear_argmax_us", "cert_graph_us", "cert_device_us")
        },
        "hf_w12_speedup": hf["hf_w12_speedup"],
        "hf_w12": {
            k: hf[k] for k in ("bf16_ms_per_token", "w12_ms_per_token", "tokens_equal_until", "model")
        },
        "raw": {
            "w12_stream": stream["rows"],
            "certified_head": head["info"],
            "hf_w12_device": hf.get("device"),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    out = gather(args.dir)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(
        json.dumps(
            {k: out[k] for k in ("m1", "m32", "of_bound_m1", "certified_head_per_call", "hf_w12_speedup")},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
