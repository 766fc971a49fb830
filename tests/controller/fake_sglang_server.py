"""A stand-in for `python -m sglang.launch_server` that speaks SGLang 0.5.20's HTTP protocol.

The real server needs a GPU, which CI does not have: this is the edge of the world the SGLang
tests cannot reach, so it is faked there and only there. The tests copy this file into a tree as
`python/sglang/launch_server.py`; the controller launches it exactly as it launches SGLang.

What it reproduces (read from the wheel: entrypoints/http_server.py, managers/tokenizer_manager.py,
managers/scheduler_components/{output_streamer,logprob_result_processor}.py):
- argument parsing that rejects unknown flags (exit code 2), booleans as bare switches;
- GET /health: 503 while loading, 200 once ready; GET /model_info;
- POST /generate, stream: chunked `text/event-stream`, `data: <json>\\n\\n` per decode step with
  cumulative `output_ids` (deltas under --incremental-streaming-output) and `meta_info`
  {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens}; the last chunk adds
  spec_verify_ct / spec_accept_length / spec_accept_rate when a speculative algorithm is set; then
  `data: [DONE]\\n\\n`;
- POST /generate, not streamed, with return_logprob / logprob_start_len / top_logprobs_num /
  token_ids_logprob: `input_token_logprobs` [[lp, id, null]] with entry 0 null-valued,
  `input_top_logprobs` and `input_token_ids_logprobs` with entry 0 null, entry j the
  distribution predicting the token at position start + j.

Its "model" is a fixed function: the argmax after context c is (31·c[-1] + 7·len(c)) mod V with
probability 0.9, the next id 0.09, the rest share 0.01. Speculative decoding commits
1 + (len(c)·7 mod block) tokens a step (capped), AR one. `fake.json` beside this file sets the
behaviour: step_ms, load_s, crash_after_chunks, hang_after_chunks, exit_on_start, never_healthy,
defect_every (every Nth output token is the runner-up instead: a planted defect).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

V = 49152
P_TOP, P_NEXT = 0.9, 0.09
P_REST = (1 - P_TOP - P_NEXT) / (V - 2)
BEHAVIOUR = json.loads((Path(__file__).with_name("fake.json")).read_text())
STATE = {"ready": False, "args": None, "rid": 0}


def argmax(ctx: list[int]) -> int:
    return (31 * ctx[-1] + 7 * len(ctx)) % V


def logprob(ctx: list[int], token: int) -> float:
    best = argmax(ctx)
    return math.log(P_TOP if token == best else P_NEXT if token == (best + 1) % V else P_REST)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    for flag in ("--device", "--dtype", "--quantization", "--attention-backend", "--speculative-algorithm",
                 "--speculative-draft-model-path"):  # fmt: skip
        p.add_argument(flag)
    for flag in ("--random-seed", "--speculative-dflash-block-size", "--speculative-dspark-block-size",
                 "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"):  # fmt: skip
        p.add_argument(flag, type=int)
    for flag in ("--enable-fp32-lm-head", "--disable-radix-cache", "--incremental-streaming-output"):
        p.add_argument(flag, action="store_true")
    return p.parse_args(argv)


def block_size(args: argparse.Namespace) -> int:
    for v in (args.speculative_dflash_block_size, args.speculative_dspark_block_size,
              args.speculative_num_draft_tokens):  # fmt: skip
        if v:
            return v
    return 1


def decode(input_ids: list[int], n: int, args: argparse.Namespace):
    """Yield the tokens committed per step; the planted defect swaps in the runner-up."""
    ctx, out, every = list(input_ids), [], BEHAVIOUR.get("defect_every") or 0
    spec = args.speculative_algorithm is not None
    while len(out) < n:
        k = 1 + (len(ctx) * 7) % block_size(args) if spec else 1
        step = []
        for _ in range(min(k, n - len(out))):
            t = argmax(ctx)
            if every and (len(out) + 1) % every == 0:
                t = (t + 1) % V
            ctx.append(t)
            out.append(t)
            step.append(t)
        time.sleep(BEHAVIOUR.get("step_ms", 5) / 1000)
        yield step


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *a) -> None:
        print("fake-sglang:", fmt % a, file=sys.stderr, flush=True)

    def _send(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path in ("/health", "/health_generate"):
            self._send(200 if STATE["ready"] else 503, {})
        elif self.path == "/model_info":
            self._send(200, {"model_path": STATE["args"].model_path, "is_generation": True})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/generate":
            return self._send(404, {"detail": "Not Found"})
        STATE["rid"] += 1
        rid = f"fake-{STATE['rid']}"
        ids, sp = body["input_ids"], body.get("sampling_params") or {}
        if body.get("return_logprob"):
            return self._send(
                200, {"text": "", "output_ids": [argmax(ids)], "meta_info": self._logprobs(rid, ids, body)}
            )
        if not body.get("stream") or sp.get("temperature") != 0.0 or sp.get("ignore_eos") is not True:
            return self._send(
                400, {"error": {"message": "the fake serves greedy streams with ignore_eos only"}}
            )
        self._stream(rid, ids, int(sp["max_new_tokens"]))

    def _stream(self, rid: str, ids: list[int], n: int) -> None:
        args, t0 = STATE["args"], time.time()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        out: list[int] = []
        for chunks, step in enumerate(decode(ids, n, args)):  # chunks sent so far
            if chunks == BEHAVIOUR.get("crash_after_chunks"):
                os._exit(3)
            if chunks == BEHAVIOUR.get("hang_after_chunks"):
                time.sleep(3600)
            out += step
            steps = chunks + 1
            done = len(out) == n
            meta = {"id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                    "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": 0}  # fmt: skip
            if done and args.speculative_algorithm:
                meta |= {"spec_verify_ct": steps, "spec_accept_length": len(out) / steps,
                         "spec_accept_rate": (len(out) - steps) / (steps * max(block_size(args) - 1, 1))}  # fmt: skip
            if done:
                meta["e2e_latency"] = time.time() - t0
            chunk = {"text": None, "output_ids": step if args.incremental_streaming_output else list(out),
                     "meta_info": meta}  # fmt: skip
            self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _logprobs(self, rid: str, ids: list[int], body: dict) -> dict:
        start, top_n, wanted = (
            body["logprob_start_len"],
            body.get("top_logprobs_num") or 0,
            body.get("token_ids_logprob"),
        )
        tok = [[None, ids[start], None]] + [
            [logprob(ids[:p], ids[p]), ids[p], None] for p in range(start + 1, len(ids))
        ]
        meta = {"id": rid, "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": len(ids),
                "completion_tokens": 1, "input_token_logprobs": tok}  # fmt: skip
        if top_n:
            meta["input_top_logprobs"] = [None] + [[[math.log(P_TOP), argmax(ids[:p]), None]][:top_n]
                                                   for p in range(start + 1, len(ids))]  # fmt: skip
        if wanted is not None:
            meta["input_token_ids_logprobs"] = [None] + [[[logprob(ids[:p], t), t, None] for t in wanted]
                                                         for p in range(start + 1, len(ids))]  # fmt: skip
        return meta


def main() -> None:
    args = STATE["args"] = parse(sys.argv[1:])
    print(f"fake-sglang: flags {sys.argv[1:]}", file=sys.stderr, flush=True)
    if BEHAVIOUR.get("exit_on_start") is not None:
        print("fake-sglang: failing on start as told", file=sys.stderr, flush=True)
        sys.exit(BEHAVIOUR["exit_on_start"])
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(BEHAVIOUR.get("load_s", 0.1))  # "loading": /health answers 503 meanwhile
    STATE["ready"] = not BEHAVIOUR.get("never_healthy")
    print("fake-sglang: The server is fired up and ready to roll!", file=sys.stderr, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
