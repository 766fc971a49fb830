"""Running a system: a process on one device slot that the controller drives as a client.

The controller is the clock: every line the system prints is timestamped on arrival by a reader
thread, and a request's output speed is new tokens / (done time − send time) on that clock. What
the system says about its own timing is kept as a claim and never read.

A system that crashes, hangs, or prints garbage makes a `SystemFailed` carrying its log tail;
the controller itself never hangs on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from specpilot.deployments import Deployment, Home

from .slots import Slot

READY_TIMEOUT_S = 600.0
# A system sees only these variables of the controller's environment (no PYTHONPATH of ours, no
# database URL, no API key) plus what the adapter sets.
PASS_ENV = {"PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "CUDA_HOME",
            "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}  # fmt: skip


class SystemFailed(Exception):
    """The system under test crashed, hung or broke the protocol (a failed run, with its log)."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class Request:
    id: str
    input_ids: list[int]
    max_new_tokens: int


@dataclass
class RequestResult:
    id: str
    t_send: float
    t_done: float = 0.0
    tokens: list[int] = field(default_factory=list)
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (controller time, tokens in line)
    claims: dict = field(default_factory=dict)  # the system's own stats: stored, never used for timing

    @property
    def seconds(self) -> float:
        return self.t_done - self.t_send

    @property
    def speed(self) -> float:
        """Output tokens per second on the controller's clock."""
        return len(self.tokens) / self.seconds


class RunningSystem(Protocol):
    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict: ...
    def run(self, request: Request, timeout_s: float) -> RequestResult: ...
    def stop(self) -> None: ...
    def usage(self) -> dict: ...


class EngineAdapter(Protocol):
    """Starts a system from a source tree on a slot."""

    def start(self, tree: Path, slot: Slot, log: Path) -> RunningSystem: ...


class _LineProcess:
    """A subprocess speaking JSON lines, its stdout read by a thread that timestamps each line."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str], log: Path, cpu_core: int | None):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 — closed in stop()
        self.cpu_core = cpu_core
        preexec = (lambda: os.sched_setaffinity(0, {cpu_core})) if cpu_core is not None else None
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            text=True, bufsize=1, preexec_fn=preexec, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._cpu_s = 0.0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.perf_counter(), line))
        self.lines.put((time.perf_counter(), None))  # end of output: the process is gone

    def log_tail(self, n: int = 40) -> str:
        self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def next_event(self, deadline: float, what: str) -> tuple[float, dict]:
        """The next JSON object the system prints, with its arrival time."""
        while True:
            remaining = deadline - time.perf_counter()
            try:
                t, line = self.lines.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                raise SystemFailed(
                    f"system hung: no output within the limit while {what}", self.log_tail()
                ) from None
            if line is None:
                code = self.proc.wait()
                raise SystemFailed(f"system exited with code {code} while {what}", self.log_tail())
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise SystemFailed(f"system printed a line that is not JSON while {what}: {line[:200]!r}",
                                   self.log_tail()) from None  # fmt: skip
            if isinstance(obj, dict):
                return t, obj
            raise SystemFailed(f"system printed a non-object while {what}: {line[:200]!r}", self.log_tail())

    def send(self, obj: dict) -> float:
        assert self.proc.stdin is not None
        t = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SystemFailed("system closed its input", self.log_tail()) from None
        return t

    def usage(self) -> dict:
        """CPU seconds used, wall seconds alive, and the cores the process may run on now."""
        out = {"wall_s": time.perf_counter() - self.t_start, "cpu_s": self._cpu_s, "cores": None}
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            out["cpu_s"] = self._cpu_s = (int(fields[11]) + int(fields[12])) / ticks
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
            out["cores"] = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                                if line.startswith("Cpus_allowed_list"))  # fmt: skip
        except (OSError, StopIteration, IndexError, ValueError):
            pass
        return out

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"shutdown": True})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (SystemFailed, OSError):
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # Whatever the system left behind (threads, children) goes with its process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)
        self._log.close()


class JsonLinesSystem:
    """A system speaking the JSON-lines serve protocol (ARCHITECTURE §4)."""

    def __init__(self, process: _LineProcess):
        self.p = process
        self.ready: dict = {}

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        deadline = time.perf_counter() + timeout_s
        while True:
            _, obj = self.p.next_event(deadline, "loading")
            if obj.get("ready") is True:
                self.ready = obj
                return obj

    def run(self, request: Request, timeout_s: float) -> RequestResult:
        t_send = self.p.send(
            {"id": request.id, "input_ids": request.input_ids, "max_new_tokens": request.max_new_tokens}
        )
        result = RequestResult(id=request.id, t_send=t_send)
        deadline = t_send + timeout_s
        while True:
            t, obj = self.p.next_event(deadline, f"serving request {request.id}")
            if obj.get("id") != request.id:
                raise SystemFailed(f"system answered request {obj.get('id')!r} while {request.id!r} was open",
                                   self.p.log_tail())  # fmt: skip
            if "error" in obj:
                raise SystemFailed(f"system reported an error on request {request.id}: {obj['error']}",
                                   self.p.log_tail())  # fmt: skip
            if "tokens" in obj:
                toks = obj["tokens"]
                if not isinstance(toks, list) or not all(isinstance(x, int) for x in toks):
                    raise SystemFailed(f"malformed tokens on request {request.id}", self.p.log_tail())
                result.tokens.extend(toks)
                result.arrivals.append((t, len(toks)))
            if obj.get("done") is True:
                result.t_done = t
                result.claims = obj.get("stats") or {}
                if len(result.tokens) != request.max_new_tokens:
                    raise SystemFailed(
                        f"request {request.id}: system committed {len(result.tokens)} tokens, "
                        f"asked for exactly {request.max_new_tokens}", self.p.log_tail())  # fmt: skip
                return result

    def stop(self) -> None:
        self.p.stop()

    def usage(self) -> dict:
        return self.p.usage()


@dataclass(frozen=True)
class RefspecAdapter:
    """`python -m refspec.serve` from a source tree, the tree alone on PYTHONPATH."""

    dep: Deployment
    home: Home

    def start(self, tree: Path, slot: Slot, log: Path) -> JsonLinesSystem:
        cmd = [sys.executable, "-s", "-m", "refspec.serve", "--device", slot.device_arg(),
               "--model", self.dep.target.model, "--cache", str(self.home.cache)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k in PASS_ENV}
        env.update(slot.env(), PYTHONPATH=str(tree), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        core = slot.index if slot.kind == "cpu" else None
        return JsonLinesSystem(_LineProcess(cmd, cwd=tree, env=env, log=log, cpu_core=core))


def adapter_for(dep: Deployment, home: Home) -> EngineAdapter:
    """The adapter that starts the deployment's systems: refspec's JSON lines, or SGLang servers."""
    if dep.engine == "refspec":
        return RefspecAdapter(dep, home)
    if dep.engine == "sglang":
        from .sglang import SglangAdapter

        return SglangAdapter(dep, home)
    from specpilot.deployments import SpecPilotError

    raise SpecPilotError(f"deployment {dep.name!r}: engine {dep.engine!r} has no adapter in this version")
