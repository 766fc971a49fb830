"""refspec's token-forcing scorer in a process of its own, on the deployment's GPU slot.

On a GPU deployment the FP32 scorer would otherwise run on the controller's CPU: on wide-h200
(a 27B-shaped target, ~17 GB in FP32) an audit took 65-177 s, most of it drawing the weights
once per controller process and forcing ~1,500 positions on the CPU. A worker process holds the
slot's lease, loads the pristine stock model in FP32 on the slot's GPU (TF32 off: the scorer's
sums are FP32 throughout) and answers one JSON line per question on stdin; close() ends it, so
no CUDA context of the controller's stays on a slot that later blocks measure, and a controller
killed mid-audit takes it along (its death signal).

The worker is `python -m specpilot.controller.scorer` (scorer.py's refspec model, served by
`serve` here). Protocol, one JSON object per line each way (the worker's own prints go to stderr):
  worker → {"ready": true, "device": ...} once loaded, or {"error": ...}
  → {"op": "score", "prompt": [...], "output": [...]}       ← {"argmax": [...], "margins": [...]}
  → {"op": "gap", "prompt", "prefix", "a", "b"}            ← {"gap": float}
  any failure ← {"error": "..."}; end of stdin ends the worker.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError

from .forcing import ScoredOutput
from .slots import Slot, lease

READY_TIMEOUT_S = 900.0  # loading (drawing a synthetic target's weights included)
ANSWER_TIMEOUT_S = 600.0  # one request forced (a long prompt on the CPU)
PR_SET_PDEATHSIG = 1


class WorkerScorer:
    """The Scorer protocol, answered by a worker process on `slot` (leased while the worker runs)."""

    def __init__(self, dep: Deployment, home: Home, slot: Slot | None = None):
        self.dep, self.home = dep, home
        self.slot = slot or Slot.parse(dep.devices.slots[0])
        self._stack: ExitStack | None = None
        self._proc: subprocess.Popen | None = None
        self.log_path = (
            home.runs / "scorer" / f"{dep.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        )

    def __enter__(self) -> WorkerScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack, self._proc = None, None

    def _worker(self) -> subprocess.Popen:
        """Start the worker (on the first question) and wait for its ready line."""
        stack = ExitStack()
        try:
            stack.enter_context(lease(self.home, [self.slot]))
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            # -P and cwd: the worker imports nothing from where the controller was started
            cmd = [sys.executable, "-P", "-m", "specpilot.controller.scorer", "--model", self.dep.target.model,
                   "--cache", str(self.home.cache), "--device", self.slot.device_arg(),
                   "--parent", str(os.getpid())]  # fmt: skip
            with open(self.log_path, "ab") as log:  # the worker's stderr; it keeps its own copy
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        env=os.environ | self.slot.env(), cwd=self.home.root, text=True, bufsize=1)  # fmt: skip
            stack.callback(_stop, proc)
            self._proc = proc
            ready = self._answer(None, READY_TIMEOUT_S)
        except BaseException:
            stack.close()
            self._proc = None
            raise
        self._stack = stack
        if not ready.get("ready"):
            self.close()
            raise SpecPilotError(
                f"the token-forcing scorer on {self.slot} answered {ready} before it was ready"
            )
        return proc

    def _answer(self, question: dict | None, timeout_s: float = ANSWER_TIMEOUT_S) -> dict:
        """The worker's answer to `question` (None: its ready line), within `timeout_s`."""
        proc = self._proc or self._worker()
        line = ""
        try:
            if question is not None:
                proc.stdin.write(json.dumps(question) + "\n")
                proc.stdin.flush()
            if select.select([proc.stdout], [], [], timeout_s)[0]:
                line = proc.stdout.readline()
                got = json.loads(line) if line else {"error": f"the worker exited (rc {proc.poll()})"}
            else:
                proc.kill()
                got = {"error": f"no answer in {timeout_s:.0f} s; the worker was stopped"}
        except OSError as e:
            got = {"error": f"{type(e).__name__}: {e}"}
        except ValueError:
            got = {"error": f"an unreadable answer {line[:200]!r}"}
        if not isinstance(got, dict):
            got = {"error": f"an answer that is not an object: {line[:200]!r}"}
        if "error" in got:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise SpecPilotError(f"the token-forcing scorer on {self.slot} failed: {got['error']} "
                                 f"(log {self.log_path}):\n{tail}")  # fmt: skip
        return got

    def score(self, rid: str, prompt: Sequence[int], output: Sequence[int]) -> ScoredOutput:
        """The scorer's argmax and the margin log p(argmax) − log p(token) at every output position."""
        if not output:
            return ScoredOutput(rid, [], [], [])
        got = self._answer({"op": "score", "prompt": list(prompt), "output": list(output)})
        return ScoredOutput(rid, list(output), got["argmax"], got["margins"])

    def logprob_gap(self, prompt: Sequence[int], prefix: Sequence[int], a: int, b: int) -> float:
        """|log p(a) − log p(b)| at the position after prompt + prefix (a first-divergence margin)."""
        return float(
            self._answer({"op": "gap", "prompt": list(prompt), "prefix": list(prefix), "a": a, "b": b})["gap"]
        )


def _stop(proc: subprocess.Popen) -> None:
    """End of stdin ends the worker; one that does not leave in 30 s is killed."""
    with suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with(parent: int) -> None:
    """SIGKILL this worker when the thread that started it ends (a controller killed mid-audit), so
    its GPU memory and context go with the controller; a parent already gone ends it now."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def serve(argv: list[str], load: Callable[[str, Path, str], Any]) -> int:
    """The worker's side (`python -m specpilot.controller.scorer ...`): `load(model, cache, device)`
    makes the scorer, and each question on stdin gets its answer."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--parent", type=int, required=True)
    args = ap.parse_args(argv)
    _die_with(args.parent)
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol's own stdout; prints go to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")

    try:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        scorer = load(args.model, Path(args.cache), args.device)
    except Exception as e:  # noqa: BLE001 - every load failure is the parent's one clear error
        say({"error": f"loading {args.model} on {args.device}: {type(e).__name__}: {e}"})
        return 1
    say({"ready": True, "device": args.device})
    for line in sys.stdin:
        try:
            q = json.loads(line)
            if q["op"] == "score":
                s = scorer.score("", q["prompt"], q["output"])
                say({"argmax": s.argmax, "margins": s.margins})
            elif q["op"] == "gap":
                say({"gap": scorer.logprob_gap(q["prompt"], q["prefix"], int(q["a"]), int(q["b"]))})
            else:
                say({"error": f"unknown op {q['op']!r}"})
        except Exception as e:  # noqa: BLE001 - answered, and the parent raises it
            say({"error": f"{type(e).__name__}: {e}"})
    return 0
