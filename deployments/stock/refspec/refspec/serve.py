"""JSON-lines server: `python -m refspec.serve --device SLOT [--model NAME_OR_PATH] [--cache DIR]`.

This file holds the measurement points the controller relies on (a protected path): the ready
line is printed only after load and warm-up, and each committed step's tokens are written and
flushed at once, so the controller's arrival timestamps are the system's real output times.

stdin, one JSON object a line: {"id", "input_ids", "max_new_tokens"} (greedy, exactly that many
new tokens, EOS ignored, served in order) or {"shutdown": true}; end of input also exits 0.
stdout: {"ready": true, ...}; {"id", "tokens"} per step; {"id", "done": true, "stats"};
{"id", "error"} for a malformed request (the server keeps serving). Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .config import load_config
from .errors import RefspecError
from .runtime import open_engine, parse_request, warm_up


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _log(msg: str) -> None:
    print(f"refspec: {msg}", file=sys.stderr, flush=True)


def serve(engine, slot: str, config) -> None:
    """Answer requests from stdin until shutdown or end of input."""
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
    args = parser.parse_args(argv)
    try:
        config = load_config()
        t0 = time.perf_counter()
        engine = open_engine(args.device, args.model, args.cache, config)
        loaded = time.perf_counter() - t0
        warm = warm_up(engine)
        _log(f"loaded {args.model} on {args.device} in {loaded:.1f}s, warmed up in {warm:.1f}s")
        serve(engine, args.device, config)
    except RefspecError as e:
        _log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
