"""Step profile per kernel class (CONTRACTS §5).

`python -m refspec.profile --device SLOT --requests REQUESTS.jsonl --out PROFILE.json [--max-requests N]`

Runs the configured mode and AR on the same requests, timing every decode step (draft + verify +
accept) with a wall clock, then runs the configured mode once more under torch.profiler with the
engine's `refspec.<class>` regions switched on, and writes the mean time per step of each class
(linear, attention, lm_head, drafter, other). The regions cover decode steps only, not prefill.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import model as model_mod
from .config import load_config
from .errors import RefspecError
from .runtime import open_engine, read_requests, warm_up, write_atomic

CLASSES = ("linear", "attention", "lm_head", "drafter", "other")


def _sync(engine) -> None:
    if engine.device.type == "cuda":
        import torch

        torch.cuda.synchronize(engine.device)


def timed_steps(engine, requests, mode: str, on_step=None) -> dict:
    """Decode every request in `mode`; per step: wall seconds, rows verified, tokens committed, context."""
    walls, rows, committed, context = [], [], [], []
    for req in requests:
        engine.start(req.input_ids, req.max_new_tokens, drafting=mode == "spec")
        done = 0
        while done < req.max_new_tokens:
            context.append(engine.pos + 1)  # committed prefix length (prompt + generated)
            _sync(engine)
            t = time.perf_counter()
            if on_step:
                on_step(True)
            tokens = engine.decode_step(mode, req.max_new_tokens - done)
            if on_step:
                on_step(False)
            _sync(engine)
            walls.append(time.perf_counter() - t)
            rows.append(engine.rows)
            tokens = tokens[: req.max_new_tokens - done]
            committed.append(len(tokens))
            done += len(tokens)
    return {"walls": walls, "rows": rows, "committed": committed, "context": context}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def class_times(engine, requests, mode: str) -> tuple[dict[str, float], int]:
    """Total profiled seconds per class over the decode steps of one run, and the step count.

    CPU: the CPU time of the `refspec.<class>` regions. CUDA graphs path: every kernel's device
    time, by kernel name (the passes run eagerly here, so each kernel is seen; the model's
    `KERNEL_CLASS` names the class, other kernels count as "other"); the drafter's region
    on the host. Eager CUDA: the GPU span of each region.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    def toggle(on: bool) -> None:
        model_mod.PROFILING = on

    activities = [ProfilerActivity.CPU]
    cuda = engine.device.type == "cuda"
    fused = hasattr(engine.model, "capture")
    if cuda:
        activities.append(ProfilerActivity.CUDA)
    try:
        if fused:
            engine.model.eager = True
        with profile(activities=activities) as prof:
            run = timed_steps(engine, requests, mode, on_step=toggle)
    finally:
        model_mod.PROFILING = False
        if fused:
            engine.model.eager = False
    totals = dict.fromkeys(CLASSES, 0.0)
    device_totals = dict.fromkeys(CLASSES, 0.0)
    for e in prof.events():
        on_cpu = e.device_type == torch.autograd.DeviceType.CPU
        if fused and not on_cpu:
            device_totals[engine.model.KERNEL_CLASS.get(e.name, "other")] += e.time_range.elapsed_us() / 1e6
            continue
        if not e.name.startswith("refspec."):
            continue
        cls = e.name.removeprefix("refspec.")
        if cls not in totals:
            continue
        if on_cpu:
            totals[cls] += e.cpu_time_total / 1e6
        elif not fused:  # the GPU-side span of the same region (kernel time on the device timeline)
            device_totals[cls] += e.time_range.elapsed_us() / 1e6
    if cuda:
        # Kernel classes run on the GPU; the drafter runs on the host either way.
        totals = {c: device_totals[c] if c != "drafter" and device_totals[c] else totals[c] for c in CLASSES}
    return totals, len(run["walls"])


def step_breakdown(
    engine, prompts: list[list[int]], max_new_tokens: int, mode: str, profiled: int = 16
) -> dict:
    """Per decode step of `mode` on the CUDA-graph path (CudaModel): kernels launched (torch.profiler
    over the first `profiled` steps), device µs (CUDA events around each pass's graph) and host µs
    (the step's wall time minus its device time: what the GPU waits on the host for). The wall
    starts after a synchronize and ends when the step returns (the pass synchronized to read its
    argmax back)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = engine.model
    walls, devs = [], []
    model.timing = []
    try:
        for p in prompts:
            engine.start(p, max_new_tokens, drafting=mode == "spec")
            done = 0
            while done < max_new_tokens:
                torch.cuda.synchronize(engine.device)
                first = len(model.timing)
                t = time.perf_counter()
                done += len(engine.decode_step(mode, max_new_tokens - done))
                walls.append(time.perf_counter() - t)
                devs.append(model.timing[first:])
        torch.cuda.synchronize(engine.device)
        devs = [sum(a.elapsed_time(b) for a, b in evs) / 1e3 for evs in devs]
    finally:
        model.timing = None
    engine.start(prompts[0], max_new_tokens, drafting=mode == "spec")
    torch.cuda.synchronize(engine.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps = 0
        for _ in range(min(profiled, max_new_tokens - 1)):
            engine.decode_step(mode, max_new_tokens)
            steps += 1
        torch.cuda.synchronize(engine.device)
    names: dict[str, int] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU:
            names[e.name] = names.get(e.name, 0) + 1
    copies = sum(n for k, n in names.items() if k.lower().startswith(("memcpy", "memset")))
    host = [w - d for w, d in zip(walls, devs, strict=True)]
    return {"steps": len(walls), "kernels_per_step": (sum(names.values()) - copies) / steps,
            "copies_per_step": copies / steps, "device_events": names,
            "wall_us_per_step": 1e6 * _mean(walls), "device_us_per_step": 1e6 * _mean(devs),
            "host_us_per_step": 1e6 * _mean(host), "host_share": _mean(host) / _mean(walls)}  # fmt: skip


def profile_requests(engine, requests, slot: str, config) -> dict:
    """The profile record of CONTRACTS §5."""
    mode = config.decode.mode
    run = timed_steps(engine, requests, mode)
    ar = run if mode == "ar" else timed_steps(engine, requests, "ar")
    totals, steps = class_times(engine, requests, mode)
    classes = {c: totals[c] / steps for c in CLASSES}
    out = {
        "engine": "refspec",
        "device": slot,
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "mode": mode,
        "block_size": config.decode.block_size,
        "rows_per_step": _mean(run["rows"]),
        "steps": len(run["walls"]),
        "tau": _mean(run["committed"]),
        "step_wall_s": _mean(run["walls"]),
        "ar_step_wall_s": _mean(ar["walls"]),
        "context_len": _mean(run["context"]),
        "classes": classes,
        "profiled_s": sum(classes.values()),
    }
    budget = getattr(engine.policy, "node_budget", None)
    if mode == "spec" and budget:
        out["node_budget"] = budget  # a tree policy's nodes: the cost model replays trees at this budget
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refspec.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cpu:N or cuda:N")
    parser.add_argument("--requests", type=Path, required=True, help="request file (JSONL)")
    parser.add_argument("--out", type=Path, required=True, help="profile file to write (JSON)")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cache", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        config = load_config()
        requests = read_requests(args.requests, args.max_requests)
        engine = open_engine(args.device, args.model, args.cache, config)
        warm_up(engine)
        result = profile_requests(engine, requests, args.device, config)
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    except RefspecError as e:
        print(f"refspec.profile: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
