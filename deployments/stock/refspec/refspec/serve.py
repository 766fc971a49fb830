"""JSON-lines server: `python -m refspec.serve --device SLOT [--model NAME_OR_PATH] [--cache DIR] [--batch]`.

This file holds the measurement points the controller relies on (a protected path): the ready
line is printed only after load and warm-up, and each committed step's tokens are written and
flushed at once, so the controller's arrival timestamps are the system's real output times.

stdin, one JSON object a line: {"id", "input_ids", "max_new_tokens"} (greedy, exactly that many
new tokens, EOS ignored, served in order) or {"shutdown": true}; end of input also exits 0.
stdout: {"ready": true, ...}; {"id", "tokens"} per step; {"id", "done": true, "stats"};
{"id", "error"} for a malformed request (the server keeps serving). Logs go to stderr.

With --batch (batch deployments) a line may also be a group, {"id", "batch": B, "requests": [...]}:
its requests are served B at a time (refspec/batch.py), each one's {"id", "tokens"} and
{"id", "done", "stats"} lines interleaved as their steps commit, then {"id": group, "done": true,
"stats": {"steps", "batch", "requests"}}. A malformed group gets one error line before any
request of it is served.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .config import load_config
from .errors import RefspecError
from .runtime import Group, open_engine, parse_group, parse_request, warm_up


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _log(msg: str) -> None:
    print(f"refspec: {msg}", file=sys.stderr, flush=True)


def serve_group(engine, group: Group, mode: str) -> None:
    from .batch import BatchEngine

    batch = BatchEngine(engine, group.batch)
    for event in batch.generate(group.requests, mode):
        _emit(event)
    stats = {"steps": batch.steps, "batch": group.batch, "requests": len(group.requests)}
    _emit({"id": group.id, "done": True, "stats": stats})


def serve(engine, slot: str, config, batch: bool = False) -> None:
    """Answer requests (and, with `batch`, groups) from stdin until shutdown or end of input."""
    dtype = str(engine.model.dtype).removeprefix("torch.")
    mode = config.decode.mode
    _emit(
        {
            "ready": True,
            "engine": "refspec",
            "device": slot,
            "dtype": dtype,
            "mode": mode,
            "knobs": config.knobs(),
            "batch": batch,
        }
    )
    for line in iter(sys.stdin.readline, ""):
        if not line.strip():
            continue
        rid = None
        try:
            obj = json.loads(line)
            if isinstance(obj, dict):
                rid = obj.get("id")
                if obj.get("shutdown") is True:
                    _log("shutdown")
                    return
                if "requests" in obj:
                    if not batch:
                        raise RefspecError(
                            "this server serves single requests; start it with --batch for groups"
                        )
                    serve_group(engine, parse_group(obj), mode)
                    continue
            req = parse_request(obj)
            for tokens in engine.generate(req.input_ids, req.max_new_tokens, mode):
                _emit({"id": req.id, "tokens": tokens})
        except (json.JSONDecodeError, RefspecError) as e:
            msg = f"malformed request line: {e}" if isinstance(e, json.JSONDecodeError) else str(e)
            _emit({"id": rid, "error": msg})
            continue
        _emit({"id": req.id, "done": True, "stats": engine.stats.to_json()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refspec.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, help="cpu:N (pinned to core N) or cuda:N")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in model name or HF folder")
    parser.add_argument("--cache", type=Path, default=None, help="weights cache (default $SPECPILOT_CACHE)")
    parser.add_argument("--batch", action="store_true", help="serve groups of requests too (the eager model)")
    args = parser.parse_args(argv)
    try:
        config = load_config()
        t0 = time.perf_counter()
        engine = open_engine(args.device, args.model, args.cache, config, eager=args.batch)
        loaded = time.perf_counter() - t0
        warm = warm_up(engine, batch=args.batch)
        _log(f"loaded {args.model} on {args.device} in {loaded:.1f}s, warmed up in {warm:.1f}s")
        serve(engine, args.device, config, args.batch)
    except RefspecError as e:
        _log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    # Out without the interpreter's teardown: freeing torch's modules and a model's tensors took
    # ~0.45 CPU-s after the last answer, every start (everything worth keeping is flushed).
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
