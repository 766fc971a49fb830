"""Cost of one refspec verification pass by row count: the c(N) curve of the stock engine.

    python bench/refspec_rows.py --device cpu:0 [--context 300] [--layouts dual,plain]
        [--rows 1,2,3,5,9,17] [--model NAME_OR_FOLDER] [--json OUT]

Per weight layout and row count N, the wall time of one forward of N chain rows (causal mask) over
a cache holding `context` tokens, and how much of it the linear layers (QKV, O, gate/up, down and
the LM head) take on their own with the same row count. Min over repeats, interleaved. A CPU slot
pins this process to one core with one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

STOCK = Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu:0")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--layouts", default="dual")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--rows", default="1,2,3,5,9,17", help="comma-separated row counts")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]

    sys.path.insert(0, str(STOCK))  # the stock engine tree, as a system runs it (no install needed)
    from refspec.config import load_config
    from refspec.runtime import open_engine

    config = load_config()
    engine = open_engine(args.device, args.model, None, config)  # pins a CPU slot
    import torch
    from refspec.model import load_model
    from refspec.weights import resolve_model

    folder = resolve_model(args.model)
    models = {
        layout: load_model(folder, engine.device, engine.model.dtype, layout)
        for layout in args.layouts.split(",")
    }
    del engine
    ctx = args.context

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def forward(model, rows: int) -> None:
        toks = torch.randint(0, model.args.vocab, (1, rows), device=model.device)
        mask = None
        if rows > 1:
            mask = torch.ones(rows, ctx + rows, dtype=torch.bool, device=model.device)
            mask[:, ctx:] = torch.ones(rows, rows, dtype=torch.bool, device=model.device).tril()
        model.forward(toks, torch.arange(ctx, ctx + rows, device=model.device), ctx, mask, ctx + rows)

    def linears(model, rows: int) -> None:
        a = model.args
        x = torch.randn(rows, a.hidden, device=model.device, dtype=model.dtype)
        y = torch.randn(rows, a.intermediate, device=model.device, dtype=model.dtype)
        o = torch.randn(rows, a.heads * a.head_dim, device=model.device, dtype=model.dtype)
        for _, wqkv, wo, _, wgu, wdown in model.layers:
            wqkv(x), wo(o), wgu(x), wdown(y)
        model.lm_head(x)

    best: dict[tuple, float] = {}
    for model in models.values():
        model.setup_cache(1, ctx + max(rows_list) + 1)
        forward(model, 2)
    for _ in range(args.repeats):
        for layout, model in models.items():
            for rows in rows_list:
                for name, fn in (("forward", forward), ("linear", linears)):
                    sync()
                    t = time.perf_counter()
                    with torch.inference_mode():
                        fn(model, rows)
                    sync()
                    key = (layout, rows, name)
                    best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)
    print(
        f"slot {args.device}, context {ctx}, load average {os.getloadavg()[0]:.2f}; ms, min of {args.repeats}"
    )
    print(f"{'layout':<8}{'rows':>5}{'forward':>9}{'linear':>8}{'c(N)':>7}")
    table = []
    for layout in models:
        base = best[(layout, 1, "forward")]
        for rows in rows_list:
            f, lin = best[(layout, rows, "forward")], best[(layout, rows, "linear")]
            print(f"{layout:<8}{rows:>5}{f * 1e3:>9.1f}{lin * 1e3:>8.1f}{f / base:>7.2f}")
            table.append(
                {"layout": layout, "rows": rows, "forward_ms": f * 1e3, "linear_ms": lin * 1e3, "c": f / base}
            )
    if args.json:
        args.json.write_text(
            json.dumps({"device": args.device, "context": ctx, "model": args.model, "rows": table}, indent=1)
        )


if __name__ == "__main__":
    main()
