"""The SGLang engine: a server per system, driven over its streaming `/generate` API.

The protocol as SGLang 0.5.20 implements it (`python/sglang/srt/entrypoints/http_server.py`,
`managers/tokenizer_manager.py`, `managers/scheduler_components/output_streamer.py`):
- `GET /health` answers 503 until the server's own warm-up generate has run, then 200.
- `POST /generate` with `{"input_ids", "sampling_params": {"temperature": 0, "max_new_tokens",
  "ignore_eos": true}, "stream": true}` answers `text/event-stream`: one `data: <json>` line and a
  blank line per scheduler output (every decode step at the default `--stream-interval 1`), then
  `data: [DONE]`. Each object has `output_ids` — every token so far, or only the new ones under
  `--incremental-streaming-output`; `meta_info.completion_tokens` tells which — and `meta_info`
  with `finish_reason` (null until the last chunk, then `{"type": "length", ...}`, or
  `{"type": "abort", "message"}`). The last chunk's meta_info also has `spec_verify_ct` (verify
  passes) and `spec_accept_length` (completion tokens / verify passes, bonus included) when
  speculative decoding is on. An error inside the stream is `{"error": {"message", ...}}`.

The controller is the clock: a reader thread timestamps every line on arrival; t_send is taken
just before the request is written, t_done at the chunk that finishes the request. What the
server says about itself (accept length, latency) is kept as a claim and never read for timing.
A server that crashes, closes the stream early, stalls or breaks the protocol is `SystemFailed`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import Deployment, Home

from .engine import READY_TIMEOUT_S, Request, RequestResult, SystemFailed, process_tree
from .sglang_launch import HOST, ServerProcess, command, deployment_flags, free_port, http_get, system_flags
from .slots import Slot

# A generating server sends a chunk every decode step; this long without one (SGLang may still
# JIT-compile a kernel on its first request) and it is hung, whatever the request's own limit.
STALL_S = 180.0
CLAIM_KEYS = ("prompt_tokens", "cached_tokens", "e2e_latency", "spec_accept_rate", "spec_num_correct_drafts",
              "spec_num_proposed_drafts", "spec_accept_histogram")  # fmt: skip


class _Stream:
    """One streaming request: the connection, and a thread queueing (arrival time, line) pairs."""

    def __init__(self, port: int, body: bytes):
        self.conn = http.client.HTTPConnection(HOST, port, timeout=10)
        self.conn.connect()
        self.sock = self.conn.sock
        self.sock.settimeout(None)  # the reader blocks; close() unblocks it
        self.lines: queue.Queue = queue.Queue()
        self.t_send = time.perf_counter()
        self.conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # Only this thread touches the response: close() just shuts the socket down under it.
        try:
            resp = self.conn.getresponse()
            if resp.status != 200:
                self.lines.put((time.perf_counter(), (resp.status, resp.read(2000))))
                return
            while line := resp.readline():
                self.lines.put((time.perf_counter(), line))
            self.lines.put((time.perf_counter(), None))
        except Exception as e:  # a broken or shut-down connection, whatever http.client makes of it
            self.lines.put((time.perf_counter(), e))
        finally:
            with contextlib.suppress(Exception):
                self.conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=5)
        self.sock.close()


def _new_tokens(seen: list[int], ids: list[int], total: int) -> list[int] | None:
    """The chunk's new tokens, whether it carries every token so far or only the new ones.

    A cumulative chunk may hold more tokens than its meta_info counts (SGLang hands the streamer
    its live list while the next step lands), never fewer; a delta chunk holds exactly the rest.
    """
    if len(ids) >= total and ids[: len(seen)] == seen:
        return ids[len(seen) :]
    if len(seen) + len(ids) == total:
        return ids
    return None


def _claims(meta: dict) -> dict:
    """The server's own account of the request, in refspec's words where they exist."""
    out = {"new_tokens": meta.get("completion_tokens")}
    if "spec_verify_ct" in meta:
        out["steps"] = meta["spec_verify_ct"]
    if "spec_accept_length" in meta:
        out["tau"] = meta["spec_accept_length"]
    return out | {k: meta[k] for k in CLAIM_KEYS if k in meta}


class SglangSystem:
    """A running SGLang server, presenting the controller's RunningSystem interface."""

    def __init__(self, proc: ServerProcess, port: int, slot: Slot):
        self.proc, self.port, self.slot = proc, port, slot
        self.ready: dict = {}

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        self.proc.wait_healthy(self.port, timeout_s)
        info = None
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            status, body = http_get(self.port, "/model_info", 10.0)
            info = json.loads(body) if status == 200 else None
        self.ready = {"ready": True, "engine": "sglang", "device": str(self.slot), "port": self.port,
                      "command": self.proc.cmd, "model_info": info}  # fmt: skip
        return self.ready

    def _fail(self, message: str) -> SystemFailed:
        return SystemFailed(message, self.proc.log_tail())

    def _gone(self, why: str, what: str) -> SystemFailed:
        """The stream broke: name the exit code when the server died (give it a moment to exit)."""
        with contextlib.suppress(Exception):
            self.proc.proc.wait(timeout=2)
        code = self.proc.exit_code()
        if code is not None:
            return self._fail(f"system exited with code {code} while {what}")
        return self._fail(f"{why} while {what}")

    def _next(self, stream: _Stream, deadline: float, what: str) -> tuple[float, object]:
        while True:
            now = time.perf_counter()
            if now >= deadline:
                raise self._fail(f"system hung: no output within the limit while {what}")
            try:
                return stream.lines.get(timeout=min(deadline - now, 0.25))
            except queue.Empty:
                code = self.proc.exit_code()
                if code is not None:
                    raise self._fail(f"system exited with code {code} while {what}") from None

    def run(self, request: Request, timeout_s: float) -> RequestResult:
        body = json.dumps({
            "input_ids": request.input_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": request.max_new_tokens, "ignore_eos": True},
            "stream": True,
        }).encode()  # fmt: skip
        what = f"serving request {request.id}"
        try:
            stream = _Stream(self.port, body)
        except (OSError, http.client.HTTPException) as e:
            raise self._gone(f"the server refused request {request.id} ({e})", what) from None
        try:
            return self._collect(stream, request, RequestResult(id=request.id, t_send=stream.t_send),
                                 stream.t_send + timeout_s, what)  # fmt: skip
        finally:
            stream.close()

    def _collect(self, stream: _Stream, request: Request, result: RequestResult, deadline: float,
                 what: str) -> RequestResult:  # fmt: skip
        last = stream.t_send
        while True:
            t, item = self._next(stream, min(deadline, last + STALL_S), what)
            if isinstance(item, tuple):
                status, text = item
                raise self._fail(f"server answered HTTP {status} to request {request.id}: {text[:300]!r}")
            if isinstance(item, Exception):
                raise self._gone(f"the stream broke ({type(item).__name__}: {item})", what)
            if item is None:
                raise self._gone("the server closed the stream before the request finished", what)
            line = item.decode(errors="replace").rstrip("\r\n")
            if not line or line.startswith(":"):
                continue  # the blank line ending an event, or an SSE comment
            if not line.startswith("data:"):
                raise self._fail(f"server sent a line that is not SSE data while {what}: {line[:200]!r}")
            payload = line[5:].strip()
            if payload == "[DONE]":
                raise self._fail(f"stream ended without a finished chunk while {what}")
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError:
                raise self._fail(
                    f"server sent data that is not JSON while {what}: {payload[:200]!r}"
                ) from None
            last = t
            if self._chunk(obj, request, result, t):
                result.t_done = t
                self._drain(stream)
                return result

    def _chunk(self, obj: object, request: Request, result: RequestResult, t: float) -> bool:
        """Take one chunk's new tokens; True when it finishes the request."""
        rid = request.id
        if isinstance(obj, dict) and "error" in obj:
            err = obj["error"]
            raise self._fail(
                f"system reported an error on request {rid}: {err.get('message', err) if isinstance(err, dict) else err}"
            )
        meta = obj.get("meta_info") if isinstance(obj, dict) else None
        ids = obj.get("output_ids") if isinstance(obj, dict) else None
        total = meta.get("completion_tokens") if isinstance(meta, dict) else None
        if not (isinstance(ids, list) and all(type(x) is int for x in ids) and type(total) is int):
            raise self._fail(
                f"malformed chunk on request {rid} (needs output_ids and meta_info.completion_tokens)"
            )
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":
            raise self._fail(f"server aborted request {rid}: {finish.get('message', 'no message')}")
        new = _new_tokens(result.tokens, ids, total)
        if new is None:
            raise self._fail(f"request {rid}: chunk of {len(ids)} tokens does not extend the {len(result.tokens)} "
                             f"received to the {total} the server counts")  # fmt: skip
        if new:
            result.tokens.extend(new)
            result.arrivals.append((t, len(new)))
        if finish is None:
            return False
        result.claims = _claims(meta)
        if len(result.tokens) != request.max_new_tokens:
            raise self._fail(f"request {rid}: system committed {len(result.tokens)} tokens, "
                             f"asked for exactly {request.max_new_tokens} (finish: {finish})")  # fmt: skip
        return True

    def _drain(self, stream: _Stream) -> None:
        """Read up to `[DONE]` briefly, so the server sees a client that finished, not one that left."""
        deadline = time.perf_counter() + 2.0
        with contextlib.suppress(queue.Empty):
            while (remaining := deadline - time.perf_counter()) > 0:
                _, item = stream.lines.get(timeout=remaining)
                if not isinstance(item, bytes) or item.strip() == b"data: [DONE]":
                    return

    def stop(self) -> None:
        self.proc.stop()

    def usage(self) -> dict:
        return self.proc.usage()

    freezes_whole = False  # process-group signals (GPU turns; never sliced)

    def pause(self, on: bool) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)

    def pids(self) -> list[int]:
        return process_tree(self.proc.proc.pid)


@dataclass(frozen=True)
class SglangAdapter:
    """`python -m sglang.launch_server` from a system tree, its `python/` alone on PYTHONPATH."""

    dep: Deployment
    home: Home

    def __post_init__(self) -> None:
        deployment_flags(self.dep)  # a bad spec is one clear error before anything starts

    def start(
        self, tree: str, path: Path, slot: Slot, log: Path, role: str = "A", prepare: bool = False
    ) -> SglangSystem:
        """A server from the export at `path`. Not confined yet: SGLang serves over a TCP port and
        reads its model from the Hugging Face cache (docs/ARCHITECTURE.md, "Confinement")."""
        flags = system_flags(self.dep, path)  # a broken launch file is the system's failure
        port = free_port()
        proc = ServerProcess(command(flags, slot, port), path, slot, log, pycache=self.home.cache / "pycache")
        return SglangSystem(proc, port, slot)

    def prepare(self, tree: str, path: Path, slot: Slot, log: Path, role: str) -> float | None:
        return None  # SGLang compiles and warms up inside its own start
