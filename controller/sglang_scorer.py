"""Token forcing through a stock SGLang server: input-token log-probabilities with the top-1.

The scorer is a server launched from the deployment's pristine stock tree (the materialized wheel,
never a candidate's tree) with the target alone, `--enable-fp32-lm-head` (SGLang 0.5.20 then
computes the logits of an unquantized head with FP32 output: `torch.mm(..., out_dtype=float32)`
on CUDA, an FP32 matmul elsewhere; a quantized head keeps its own method) and
`--disable-radix-cache` (every sequence is prefilled afresh, so a score never depends on what
was scored before). It holds a lease on the deployment's first slot while it runs.

One non-streaming `/generate` per sequence: `input_ids` = prompt + output, `return_logprob`,
`logprob_start_len` = len(prompt) − 1, `top_logprobs_num` = 1. SGLang answers, for positions
start .. len − 1, `meta_info.input_token_logprobs` = [[logprob, token id, text], ...] and
`input_top_logprobs` = [[[logprob, id, text]], ...]; entry 0 is null and entry j is the
distribution predicting the token at position start + j (`logprob_result_processor.py`: `[None] +
logprobs[:-1]`). So entries 1..n score the n output tokens.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import stock_for

from .engine import READY_TIMEOUT_S, SystemFailed
from .forcing import ScoredOutput
from .sglang_launch import HOST, ServerProcess, command, free_port, scorer_flags
from .slots import Slot, lease

SCORE_TIMEOUT_S = 600.0  # one prefill of prompt + output


class SglangScorer:
    """Scores outputs with stock SGLang's target (FP32 LM head); close() stops its server."""

    def __init__(self, dep: Deployment, home: Home, slot: Slot | None = None):
        if dep.engine != "sglang":
            raise SpecPilotError(
                f"deployment {dep.name!r}: the SGLang scorer cannot score engine {dep.engine!r}"
            )
        self.dep, self.home = dep, home
        self.slot = slot or Slot.parse(dep.devices.slots[0])
        self.flags = scorer_flags(dep)
        self._stack: ExitStack | None = None
        self._proc: ServerProcess | None = None
        self._port = 0

    def __enter__(self) -> SglangScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack, self._proc = None, None

    def _server(self) -> tuple[int, ServerProcess]:
        if self._proc is not None:
            return self._port, self._proc
        stack = ExitStack()
        try:
            stack.enter_context(lease(self.home, [self.slot]))
            tree = stock_for(self.dep, self.home).path
            port = free_port()
            log = (
                self.home.runs
                / "scorer"
                / f"{self.dep.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
            )
            proc = ServerProcess(command(self.flags, self.slot, port), tree, self.slot, log,
                                 pycache=self.home.cache / "pycache")  # fmt: skip
            stack.callback(proc.stop)
            proc.wait_healthy(port, READY_TIMEOUT_S)
        except SystemFailed as e:
            stack.close()
            raise SpecPilotError(f"the token-forcing scorer (stock SGLang, FP32 LM head) did not start: {e}\n"
                                 f"{e.log_tail}") from None  # fmt: skip
        except BaseException:
            stack.close()
            raise
        self._stack, self._proc, self._port = stack, proc, port
        return port, proc

    def _meta(self, input_ids: list[int], start: int, **logprob_args) -> dict:
        port, proc = self._server()
        body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
                "return_logprob": True, "logprob_start_len": start, **logprob_args}  # fmt: skip
        conn = http.client.HTTPConnection(HOST, port, timeout=SCORE_TIMEOUT_S)
        try:
            conn.request(
                "POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            status, data = resp.status, resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise SpecPilotError(
                f"the scorer server failed ({e}); its log {proc.log_path}:\n{proc.log_tail()}"
            ) from None
        finally:
            conn.close()
        try:
            meta = json.loads(data)["meta_info"] if status == 200 else None
        except (ValueError, KeyError, TypeError):
            meta = None
        if not isinstance(meta, dict):
            raise SpecPilotError(
                f"the scorer server answered HTTP {status}: {data[:300]!r} (log {proc.log_path})"
            )
        return meta

    def _rows(self, meta: dict, key: str, seq: Sequence[int], start: int) -> list:
        """meta_info[key], checked to line up with positions start..len−1 (entry 0 has no log-prob)."""
        rows, n = meta.get(key), len(seq) - start
        ok = isinstance(rows, list) and len(rows) == n
        if ok and key == "input_token_logprobs":
            # SGLang reports ids >= vocab − 1 as 0 (its clip for image-token hashes).
            ok = all(r[1] in (t, 0) for r, t in zip(rows, seq[start:], strict=True)) and rows[0][0] is None
            ok = ok and all(r[0] is not None for r in rows[1:])
        elif ok:
            ok = rows[0] is None and all(isinstance(r, list) and r for r in rows[1:])
        if not ok:
            raise SpecPilotError(
                f"the scorer server's {key} does not line up with the {n} positions from {start} it was asked for "
                "(did SGLang's logprob format change?)"
            )
        return rows

    def score(self, rid: str, prompt: Sequence[int], output: Sequence[int]) -> ScoredOutput:
        """The scorer's argmax and the margin log p(argmax) − log p(token) at every output position."""
        if not output:
            return ScoredOutput(rid, [], [], [])
        if not prompt:
            raise SpecPilotError(f"request {rid}: an empty prompt cannot be scored")
        seq, start = list(prompt) + list(output), len(prompt) - 1
        meta = self._meta(seq, start, top_logprobs_num=1)
        tok = self._rows(meta, "input_token_logprobs", seq, start)
        top = self._rows(meta, "input_top_logprobs", seq, start)
        argmax, margins = [], []
        for i, t in enumerate(output):
            best_lp, best = top[i + 1][0][0], int(top[i + 1][0][1])
            argmax.append(best)
            margins.append(0.0 if best == t else max(0.0, float(best_lp) - float(tok[i + 1][0])))
        return ScoredOutput(rid, list(output), argmax, margins)

    def logprob_gap(self, prompt: Sequence[int], prefix: Sequence[int], a: int, b: int) -> float:
        """|log p(a) − log p(b)| at the position after prompt + prefix (a first-divergence margin)."""
        seq = list(prompt) + list(prefix) + [a]
        start = len(seq) - 2
        meta = self._meta(seq, start, token_ids_logprob=[a, b])
        row = self._rows(meta, "input_token_ids_logprobs", seq, start)[1]
        lp = {int(r[1]): float(r[0]) for r in row}
        if a not in lp or b not in lp:
            raise SpecPilotError(f"the scorer server gave no log-probability for tokens {a} and {b}")
        return abs(lp[a] - lp[b])
