"""A loopback stand-in for the Anthropic Messages API: the one fake of these tests (the paid edge).

It speaks the real wire protocol the Claude Code CLI uses (`POST /v1/messages`, `x-api-key`
authentication, server-sent events `message_start` / `content_block_start` / `ping` /
`content_block_delta` (`text_delta`, `input_json_delta` in several pieces) / `content_block_stop` /
`message_delta` / `message_stop`, or one JSON message when `stream` is false, and the API's error
bodies) and replays scripted assistant turns in order. Each request it receives is kept (headers
and body) so a test can check what the model would have seen.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Blocks = list[dict[str, Any]]


def text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


_ids = itertools.count(1)


def tool_use(name: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": input}


@dataclass
class Turn:
    """One scripted assistant message; `usage` sets the token counts the CLI prices."""

    blocks: Blocks | Callable[[dict[str, Any]], Blocks]
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 1200, "output_tokens": 150})


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeMessagesAPI:
    """Serve `script` on 127.0.0.1 (an ephemeral port) to clients presenting `key`."""

    def __init__(self, key: str, script: list[Turn | Blocks]):
        self.key = key
        self.script = [t if isinstance(t, Turn) else Turn(t) for t in script]
        self.requests: list[Seen] = []
        self.exhausted = False
        self.served = 0  # message requests answered
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeMessagesAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self) -> Turn:
        with self._lock:
            self.served += 1
            if self.served <= len(self.script):
                return self.script[self.served - 1]
            self.exhausted = True
            return Turn([text("(the fake API's script is exhausted)")])

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.send_header("request-id", f"req_fake{next(_ids)}")
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status: int, kind: str, message: str) -> None:
                err = {"type": "error", "error": {"type": kind, "message": message}}
                self._send(status, json.dumps(err).encode())

            def do_GET(self) -> None:
                self._error(404, "not_found_error", f"no route {self.path}")

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    return self._error(400, "invalid_request_error", "body is not JSON")
                with api._lock:
                    api.requests.append(Seen(self.path, dict(self.headers), body))
                if self.headers.get("x-api-key") != api.key:
                    return self._error(401, "authentication_error", "invalid x-api-key")
                path = self.path.split("?")[0]
                if path == "/v1/messages/count_tokens":
                    return self._send(200, json.dumps({"input_tokens": len(raw) // 4}).encode())
                if path != "/v1/messages":
                    return self._error(404, "not_found_error", f"no route {self.path}")
                turn = api._take()
                blocks = turn.blocks(body) if callable(turn.blocks) else turn.blocks
                msg_id = f"msg_fake{next(_ids):04d}"
                stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
                if not body.get("stream"):
                    msg = {"id": msg_id, "type": "message", "role": "assistant", "model": body["model"], "content": blocks,
                           "stop_reason": stop, "stop_sequence": None, "usage": turn.usage}  # fmt: skip
                    return self._send(200, json.dumps(msg).encode())
                self._send(200, _sse(msg_id, body["model"], blocks, stop, turn.usage), "text/event-stream")

        return Handler


def _sse(msg_id: str, model: str, blocks: Blocks, stop: str, usage: dict[str, int]) -> bytes:
    def ev(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n"

    start_usage = {"input_tokens": usage["input_tokens"], "output_tokens": 1,
                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}  # fmt: skip
    out = [ev("message_start", {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": start_usage}}), ev("ping", {"type": "ping"})]  # fmt: skip
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            out.append(ev("content_block_start", {"type": "content_block_start", "index": i,
                                                  "content_block": {"type": "text", "text": ""}}))  # fmt: skip
            out.append(ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                                  "delta": {"type": "text_delta", "text": b["text"]}}))  # fmt: skip
        else:
            out.append(ev("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))  # fmt: skip
            args = json.dumps(b["input"])
            for k in range(0, len(args), 40):  # the API streams tool input as partial JSON pieces
                out.append(ev("content_block_delta", {"type": "content_block_delta", "index": i,
                                                      "delta": {"type": "input_json_delta", "partial_json": args[k:k + 40]}}))  # fmt: skip
        out.append(ev("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                    "usage": {"output_tokens": usage["output_tokens"]}}))  # fmt: skip
    out.append(ev("message_stop", {"type": "message_stop"}))
    return "".join(out).encode()
