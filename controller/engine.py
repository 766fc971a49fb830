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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from .confine import FSIZE, Launch
from .slots import Slot

READY_TIMEOUT_S = 600.0
# A server system (SGLang) sees only these variables of the controller's environment (no
# PYTHONPATH of ours, no database URL, no API key) plus what its adapter sets.
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


@dataclass(frozen=True)
class Group:
    """Requests a batch system serves together, `batch` at a time (a batch deployment's unit): its
    result's tokens are its requests' outputs in order, its speed the group's output throughput."""

    id: str
    batch: int
    requests: tuple[Request, ...]

    @property
    def max_new_tokens(self) -> int:
        return sum(r.max_new_tokens for r in self.requests)


@dataclass
class RequestResult:
    id: str
    t_send: float
    t_done: float = 0.0
    tokens: list[int] = field(default_factory=list)
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (controller time, tokens in line)
    claims: dict = field(default_factory=dict)  # the system's own stats: stored, never used for timing
    active_s: float | None = None  # sliced design: the seconds the system ran between send and done
    parts: dict[str, list[int]] = field(default_factory=dict)  # a group's: each request's output

    @property
    def seconds(self) -> float:
        return self.t_done - self.t_send if self.active_s is None else self.active_s

    @property
    def speed(self) -> float:
        """Output tokens per second on the controller's clock (the time the system ran, when sliced)."""
        return len(self.tokens) / self.seconds


class RunningSystem(Protocol):
    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict: ...
    def run(self, request: Request | Group, timeout_s: float) -> RequestResult: ...
    def stop(self) -> dict | None: ...  # what it did in its exit window, where measured
    def usage(self) -> dict: ...
    def pause(self, on: bool) -> None: ...
    def pids(self) -> list[int]: ...
    @property
    def freezes_whole(self) -> bool:
        """Whether `pause` stops every process of the system (a cgroup freezer), not one group."""
        ...


class EngineAdapter(Protocol):
    """Starts a system (tree hash, its export) on a slot; `prepare` fills its compile cache once."""

    def start(self, tree: str, path: Path, slot: Slot, log: Path, role: str = "A",
              prepare: bool = False) -> RunningSystem: ...  # fmt: skip
    def prepare(self, tree: str, path: Path, slot: Slot, log: Path, role: str) -> float | None: ...


MAX_LINE = 4 << 20  # a line longer than this is a flood, not protocol


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (host pids)."""
    try:
        return [root, *(c.pid for c in psutil.Process(root).children(recursive=True))]
    except psutil.Error:
        return [root]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the live processes among `pids` (all their threads)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def allowed_cores(pids: list[int]) -> str | None:
    """The cores any of `pids` may run on, as "0" or "0,1" (None when none is alive)."""
    cores: set[int] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            cores |= set(psutil.Process(pid).cpu_affinity())
    return ",".join(map(str, sorted(cores))) if cores else None


class LineProcess:
    """A confined subprocess speaking JSON lines, its stdout read by a thread that timestamps each line."""

    def __init__(self, launch: Launch, cwd: Path, log: Path, cpus: set[int] | None):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path, self.launch = log, launch
        self._log = open(log, "wb")  # noqa: SIM115 — closed in stop()
        self._log.write(f"$ {' '.join(launch.argv)}\n".encode())
        self._log.flush()
        self.cpus = cpus
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.t_start = time.perf_counter()
        # stderr is a pipe the controller copies into the log: a file's name would tell the
        # system which kind of run it is in (an audit's, a timed period's).
        self.proc = subprocess.Popen(
            launch.argv, cwd=cwd, env=launch.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, preexec_fn=preexec, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[tuple[float, bytes | None]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._copier = threading.Thread(target=self._copy_stderr, daemon=True)
        self._copier.start()
        self._cpu_s = 0.0
        self.paused = False
        self.exit: dict | None = None  # what stop() measured of the exit window

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := self.proc.stdout.readline(MAX_LINE):
            self.lines.put((time.perf_counter(), line))
        self.lines.put((time.perf_counter(), None))  # end of output: the process is gone

    def _copy_stderr(self) -> None:
        """The system's stderr into its log, up to the size any file of it may have."""
        assert self.proc.stderr is not None
        written = 0
        while chunk := self.proc.stderr.read1(1 << 16):
            if written < FSIZE:
                self._log.write(chunk[: FSIZE - written])
                self._log.flush()
            written += len(chunk)

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
                why = " (it wrote a file past the size limit)" if code == 128 + signal.SIGXFSZ else ""
                raise SystemFailed(f"system exited with code {code}{why} while {what}", self.log_tail())
            if len(line) >= MAX_LINE and not line.endswith(b"\n"):
                raise SystemFailed(f"system flooded its output: a line of more than {MAX_LINE >> 20} MiB while {what}",
                                   self.log_tail())  # fmt: skip
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise SystemFailed(f"system printed a line that is not JSON while {what}: {line[:200]!r}",
                                   self.log_tail()) from None  # fmt: skip
            if isinstance(obj, dict):
                return t, obj
            raise SystemFailed(f"system printed a non-object while {what}: {line[:200]!r}", self.log_tail())

    def send(self, obj: dict) -> float:
        assert self.proc.stdin is not None
        t = time.perf_counter()
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SystemFailed("system closed its input", self.log_tail()) from None
        return t

    @property
    def freezes_whole(self) -> bool:
        return self.launch.cgroup is not None

    def pause(self, on: bool) -> None:
        """Freeze (or thaw) the whole system while the other one has its turn on the same device."""
        cg = self.launch.cgroup
        if cg is not None:
            cg.freeze(on)
        else:
            self._signal_all(signal.SIGSTOP if on else signal.SIGCONT)
        self.paused = on

    def _signal_all(self, sig: int, rounds: int = 50) -> None:
        """Signal every process below the launcher (without a cgroup): one that left the process
        group with setsid() is still below it, as the jail's PID namespace keeps orphans under its
        init. Listed again until no new one turns up, so a child forked meanwhile is caught too."""
        sent: set[int] = set()
        while rounds and (new := set(process_tree(self.proc.pid)) - sent):
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            sent, rounds = sent | new, rounds - 1

    def pids(self) -> list[int]:
        cg = self.launch.cgroup
        return cg.pids() if cg is not None else process_tree(self.proc.pid)

    def usage(self) -> dict:
        """CPU seconds used (every thread and child), wall seconds alive, and where it may run."""
        out = {"wall_s": time.perf_counter() - self.t_start, "cpu_s": self._cpu_s, "cores": None,
               "cpuset": self.launch.cgroup is not None}  # fmt: skip
        with contextlib.suppress(OSError, ValueError):
            cg = self.launch.cgroup
            pids = self.pids()
            out["cpu_s"] = self._cpu_s = cg.cpu_seconds() if cg is not None else cpu_seconds(pids)
            out["cores"] = allowed_cores(pids)
        return out

    def stop(self, grace_s: float = 10.0) -> dict:
        """Shut the system down (it may take `grace_s`), then kill whatever it left. What it did
        after its last request — seconds to exit and CPU seconds spent — is returned and kept in
        `exit`; the CPU is read from its cgroup, which still counts the exited processes."""
        if self.exit is not None:
            return self.exit
        if self.paused:
            with contextlib.suppress(OSError):
                self.pause(False)
        cpu0, t0 = self.usage()["cpu_s"], time.perf_counter()
        if self.proc.poll() is None:
            try:
                self.send({"shutdown": True})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except (SystemFailed, OSError):
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        exit_s = time.perf_counter() - t0
        exit_cpu = self.usage()["cpu_s"] - cpu0 if self.launch.cgroup is not None else None
        # Whatever the system left behind (threads, children) goes with its process group and cgroup.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=5)
        self._copier.join(timeout=5)
        self._log.close()
        self.launch.cleanup()
        self.exit = {"exit_s": exit_s, "exit_cpu_s": exit_cpu, "cpu_total_s": self._cpu_s}
        return self.exit


class JsonLinesSystem:
    """A system speaking the JSON-lines serve protocol (ARCHITECTURE §4)."""

    def __init__(self, process: LineProcess):
        self.p = process
        self.ready: dict = {}

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> dict:
        deadline = time.perf_counter() + timeout_s
        while True:
            t, obj = self.p.next_event(deadline, "loading")
            if obj.get("ready") is True:  # on the controller's clock, and its CPU until then
                self.ready = obj | {"_ready_s": t - self.p.t_start, "_ready_cpu_s": self.p.usage()["cpu_s"]}
                return self.ready

    def run(self, request: Request | Group, timeout_s: float) -> RequestResult:
        if isinstance(request, Group):
            return self._run_group(request, timeout_s)
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

    def _run_group(self, group: Group, timeout_s: float) -> RequestResult:
        """Send the group in one line; take each request's lines in any order, every one of them
        committing exactly its max_new_tokens before the group's done line."""
        reqs = {r.id: r for r in group.requests}
        t_send = self.p.send({"id": group.id, "batch": group.batch, "requests": [
            {"id": r.id, "input_ids": r.input_ids, "max_new_tokens": r.max_new_tokens} for r in group.requests]})  # fmt: skip
        result = RequestResult(id=group.id, t_send=t_send, parts={rid: [] for rid in reqs})
        done: set[str] = set()
        deadline = t_send + timeout_s
        while True:
            t, obj = self.p.next_event(deadline, f"serving group {group.id}")
            rid = obj.get("id")
            if "error" in obj:
                raise SystemFailed(f"system reported an error on group {group.id} ({rid}): {obj['error']}",
                                   self.p.log_tail())  # fmt: skip
            if rid == group.id and obj.get("done") is True:
                if done != set(reqs):
                    raise SystemFailed(f"group {group.id}: done before requests {sorted(set(reqs) - done)}",
                                       self.p.log_tail())  # fmt: skip
                result.t_done, result.claims = t, obj.get("stats") or {}
                result.tokens = [tok for r in group.requests for tok in result.parts[r.id]]
                return result
            if rid not in reqs or rid in done:
                raise SystemFailed(f"system answered {rid!r} while group {group.id} was open"
                                   + (" (after its done line)" if rid in done else ""), self.p.log_tail())  # fmt: skip
            if "tokens" in obj:
                toks = obj["tokens"]
                if not isinstance(toks, list) or not all(isinstance(x, int) for x in toks):
                    raise SystemFailed(f"malformed tokens on request {rid}", self.p.log_tail())
                result.parts[rid].extend(toks)
                result.arrivals.append((t, len(toks)))
            if obj.get("done") is True:
                if len(result.parts[rid]) != reqs[rid].max_new_tokens:
                    raise SystemFailed(
                        f"request {rid}: system committed {len(result.parts[rid])} tokens, "
                        f"asked for exactly {reqs[rid].max_new_tokens}", self.p.log_tail())  # fmt: skip
                done.add(rid)

    def stop(self) -> dict:
        return self.p.stop()

    def usage(self) -> dict:
        return self.p.usage()

    @property
    def freezes_whole(self) -> bool:
        return self.p.freezes_whole

    def pause(self, on: bool) -> None:
        self.p.pause(on)

    def pids(self) -> list[int]:
        return self.p.pids()
