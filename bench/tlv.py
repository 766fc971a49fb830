"""TLV (the refspec-tlv entry) against stock's chain and the tree policy: τ, Q-pass agreement, the cycle.

    python bench/tlv.py --tree ENTRY_TREE --model FOLDER --requests FILE [--device cuda:0]
                        [--prompts 12] [--tokens 128] [--nodes 16] --json OUT

ENTRY_TREE is a checkout of the refspec-tlv entry (stock + refspec-tree-verify + refspec-tlv, e.g.
`specpilot memory replay -d smollm-h200 --entries refspec-tlv --out DIR`); its `refspec` package runs
here with its own knob files, three engines on one model: stock chain, the tree policy of `--nodes`
nodes, and TLV with the same node budget. Per system and prompt: greedy output (checked against AR),
τ = new tokens per verification pass (for TLV: per exact pass) and the time of each step, split into
draft (both of TLV's drafts and tree building), Q pass, exact pass and append (acceptance, K/V
compaction, the drafter's extension), on the host clock (every pass returns its argmax to the host,
so a pass's time is its device time plus launch). The cost model's view: a system's speed over the
chain is τ / τ_chain × t_chain / t_step, with t the measured step (cycle) time, and a Q pass pays
off only below its break-even time (`cost_view`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


class Split:
    """Seconds spent per part of a decode step, by wrapping the engine's calls on the instance."""

    def __init__(self, engine):
        self.t = dict.fromkeys(("step", "stepcall", "exact_pass", "q_pass"), 0.0)
        self.steps = 0
        self._wrap(engine, "decode_step", "step")
        self._wrap(engine, "step", "stepcall")
        self._wrap(engine, "verify", "exact_pass")
        q = getattr(engine.policy, "q", None)
        if q is not None:
            self._wrap(q, "verify", "q_pass")

    def _wrap(self, obj, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[key] += time.perf_counter() - t
                self.steps += key == "step"

        setattr(obj, name, timed)

    def ms(self) -> dict:
        t, n = self.t, max(self.steps, 1)
        parts = {"draft": t["step"] - t["stepcall"] - t["q_pass"], "q_pass": t["q_pass"],
                 "exact_pass": t["exact_pass"], "append": t["stepcall"] - t["exact_pass"]}  # fmt: skip
        return {k: 1e3 * v / n for k, v in parts.items()} | {"step": 1e3 * t["step"] / n}


def cost_view(chain: dict, system: dict) -> dict:
    """A system's speed over the chain from τ and step times, and the Q pass's break-even time:
    the system beats the chain while t_Q < (τ / τ_chain) · t_chain − (t_exact + t_draft + t_append)."""
    c, t = chain["step_ms"], system["step_ms"]
    tau_gain = system["tau"] / chain["tau"]
    break_even = tau_gain * c["step"] - (t["exact_pass"] + t["draft"] + t["append"])
    return {"tau_gain": tau_gain, "step_cost": t["step"] / c["step"], "speed_over_chain": tau_gain * c["step"] / t["step"],
            "q_pass_share_of_step": t["q_pass"] / t["step"], "break_even_q_pass_ms": break_even,
            "break_even_q_over_exact": break_even / t["exact_pass"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=Path, required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))

    import torch
    from refspec import ext
    from refspec.config import load_config
    from refspec.generate import Engine, greedy
    from refspec.runtime import warm_up
    from refspec.weights import resolve_model

    device = torch.device(args.device)
    torch.set_num_threads(1)
    folder = resolve_model(args.model)
    if device.type == "cuda":
        from refspec.cuda_graphs import CudaModel
        from refspec.model import load_weights

        model = CudaModel(*load_weights(folder), device, 4096)
    else:
        from refspec.model import load_model

        model = load_model(folder, device, torch.float32, "dual")
    prompts = [json.loads(x)["input_ids"] for x in args.requests.read_text().splitlines() if x.strip()]
    prompts = prompts[: args.prompts]

    def engine(tree: bool, tlv: bool):
        config = load_config()
        config.ext["tree"] = {**config.ext["tree"], "enabled": tree, "nodes": args.nodes}
        config.ext["tlv"] = {**config.ext["tlv"], "enabled": tlv}
        t = time.perf_counter()
        e = Engine(model, config, ext.load(config))
        setup_s = time.perf_counter() - t
        warm_up(e)
        return e, setup_s

    ar_engine, _ = engine(False, False)
    ar = [greedy(ar_engine, p, args.tokens, "ar")[0] for p in prompts]
    out: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "torch": torch.__version__, "prompts": len(prompts), "tokens": args.tokens,
                 "nodes": args.nodes, "systems": {}}  # fmt: skip
    for name, tree, tlv in (("chain", False, False), ("tree", True, False), ("tlv", True, True)):
        e, setup_s = engine(tree, tlv)
        split = Split(e)
        steps = new = equal = 0
        t = time.perf_counter()
        for p, want in zip(prompts, ar, strict=True):
            got, stats = greedy(e, p, args.tokens, "spec")
            steps, new, equal = steps + stats.steps, new + stats.new_tokens, equal + (got == want)
        wall = time.perf_counter() - t
        res = {"tau": new / steps, "steps": steps, "equals_ar": f"{equal}/{len(prompts)}",
               "ms_per_token": 1e3 * wall / new, "step_ms": split.ms(), "setup_s": setup_s}  # fmt: skip
        if tlv:
            res["qpass_agreement"] = e.policy.q_agreed / max(e.policy.q_checked, 1)
            res["q_checked"] = e.policy.q_checked
        out["systems"][name] = res
        print(name, json.dumps(res), flush=True)
    s = out["systems"]
    out["cost_model"] = {n: cost_view(s["chain"], s[n]) for n in ("tree", "tlv")}
    out["tokens_per_exact_pass"] = s["tlv"]["tau"]
    out["chain_tau"], out["tree_tau"] = s["chain"]["tau"], s["tree"]["tau"]
    out["qpass_agreement"] = s["tlv"]["qpass_agreement"]
    out["cycle_ms"] = {k: v for k, v in s["tlv"]["step_ms"].items() if k != "step"}
    print(json.dumps({k: v for k, v in out.items() if k != "systems"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
