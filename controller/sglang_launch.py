"""Launching SGLang servers: the flags of a system, and the server process the controller owns.

A system's flags come from three layers, later ones winning flag by flag:
1. the deployment: target, dtype/quantization and the drafter mapped onto SGLang 0.5.20's server
   arguments (DFLASH / DSPARK / EAGLE3 / NGRAM), then its `engine_flags` verbatim;
2. the system's own `specpilot-launch.toml` (tree root): `[decode] mode` ("spec" | "ar") and
   `[server]` flag overrides, so a memory entry retunes a flag by patching one line;
3. the controller's own flags (host, port, device), which nothing may override.
AR drops every `speculative-*` flag; the scorer runs the target alone with an FP32 LM head.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil

from specpilot.deployments import Deployment, SpecPilotError
from specpilot.deployments.stock import LAUNCH_FILE

from .engine import PASS_ENV, SystemFailed, allowed_cores, cpu_seconds
from .slots import Slot

FlagValue = str | int | float | bool
HOST = "127.0.0.1"
# Flags the controller sets for every server; a tree or a deployment that sets one is refused.
OWNED = {"host", "port", "device", "model-path", "model"}
# What a server sees of the controller's environment besides PASS_ENV: where the Hugging Face
# cache is (weights are downloaded beforehand; servers run with HF_HUB_OFFLINE=1).
SGLANG_PASS_ENV = {"HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"}
_DTYPE = {
    "bfloat16": {"dtype": "bfloat16"},
    "float16": {"dtype": "float16"},
    "float32": {"dtype": "float32"},
    "fp8": {"dtype": "bfloat16", "quantization": "fp8"},  # SGLang's FP8 weights, BF16 activations
}
_FLAG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def engine_python() -> str:
    """The interpreter that runs servers: SPECPILOT_SGLANG_PYTHON, else the controller's own."""
    return os.environ.get("SPECPILOT_SGLANG_PYTHON") or sys.executable


def speculative_flags(dep: Deployment) -> dict[str, FlagValue]:
    """The deployment's drafter as SGLang 0.5.20 server arguments."""
    d = dep.drafter

    def model() -> str:
        if not d.model:
            raise SpecPilotError(f"deployment {dep.name!r}: drafter.model is required for a {d.kind} drafter")
        return d.model

    if d.kind == "dflash2":
        # DFLASH; the DFlash2 candidate selector is the draft checkpoint's architecture
        # (DFlash2DraftModel), its top-k the checkpoint's selector_top_k. Block = verify window.
        return {"speculative-algorithm": "DFLASH", "speculative-draft-model-path": model(),
                "speculative-dflash-block-size": d.block_size}  # fmt: skip
    if d.kind == "dspark":
        # Block = gamma, the drafted tokens (verify window gamma + 1); the draft may be bundled
        # with the target, in which case SGLang finds it without a path.
        out: dict[str, FlagValue] = {"speculative-algorithm": "DSPARK"}
        if d.model:
            out["speculative-draft-model-path"] = d.model
        return out | {"speculative-dspark-block-size": d.block_size}
    if d.kind == "eagle3":
        out = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": model(),
               "speculative-num-steps": d.block_size, "speculative-eagle-topk": d.top_k}  # fmt: skip
        if d.top_k == 1:
            out["speculative-num-draft-tokens"] = d.block_size + 1  # SGLang's rule for a chain
        elif "speculative-num-draft-tokens" not in dep.engine_flags:
            raise SpecPilotError(
                f"deployment {dep.name!r}: an eagle3 tree (drafter.top_k = {d.top_k} > 1) needs "
                "engine_flags.speculative-num-draft-tokens (the tree's node budget)"
            )
        return out
    return {"speculative-algorithm": "NGRAM", "speculative-num-draft-tokens": d.block_size}


def _check_flags(flags: dict, where: str) -> None:
    for key, value in flags.items():
        if not _FLAG.match(str(key)):
            raise SpecPilotError(
                f"{where}: {key!r} is not a server flag name (lowercase words joined by '-')"
            )
        if key in OWNED:
            raise SpecPilotError(f"{where}: --{key} is set by the controller and may not be overridden")
        if not isinstance(value, str | int | float | bool):
            raise SpecPilotError(f"{where}: --{key} must be a string, number or boolean")


def deployment_flags(dep: Deployment) -> dict[str, FlagValue]:
    """Layer 1: the deployment's model, dtype, drafter and engine_flags (checked, never launched)."""
    _check_flags(dep.engine_flags, f"deployment {dep.name!r} engine_flags")
    base: dict[str, FlagValue] = {
        "model-path": dep.target.model,
        **_DTYPE[dep.target.dtype],
        "random-seed": 0,
    }
    return base | speculative_flags(dep) | dict(dep.engine_flags)


def read_launch_knobs(tree: Path) -> tuple[str, dict[str, FlagValue]]:
    """(mode, server flag overrides) from the tree's launch file; a missing file means stock's."""
    path = tree / LAUNCH_FILE
    if not path.is_file():
        return "spec", {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SystemFailed(f"{LAUNCH_FILE} of the system is unreadable: {e}") from None
    decode, server = data.get("decode", {}), data.get("server", {})
    if not isinstance(decode, dict) or not isinstance(server, dict):
        raise SystemFailed(f"{LAUNCH_FILE}: [decode] and [server] must be tables")
    unknown = sorted((set(data) - {"decode", "server"}) | {f"decode.{k}" for k in decode if k != "mode"})
    if unknown:
        raise SystemFailed(f"{LAUNCH_FILE}: unknown section or key {unknown}; known: [decode] mode, [server]")
    mode = decode.get("mode", "spec")
    if mode not in ("spec", "ar"):
        raise SystemFailed(f'{LAUNCH_FILE}: decode.mode must be "spec" or "ar", not {mode!r}')
    try:
        _check_flags(server, f"{LAUNCH_FILE} [server]")
    except SpecPilotError as e:
        raise SystemFailed(str(e)) from None
    return mode, dict(server)


def _no_speculation(flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
    return {
        k: v for k, v in flags.items() if not k.startswith("speculative-") and k != "enable-multi-layer-eagle"
    }


def system_flags(dep: Deployment, tree: Path) -> dict[str, FlagValue]:
    """Layers 1 and 2 for a system tree (the controller adds host, port and device at launch)."""
    mode, server = read_launch_knobs(tree)
    flags = deployment_flags(dep) | server
    return _no_speculation(flags) if mode == "ar" else flags


def scorer_flags(dep: Deployment) -> dict[str, FlagValue]:
    """The token-forcing scorer: stock's target alone, FP32 LM head, every prompt prefilled afresh."""
    flags = _no_speculation(deployment_flags(dep))
    return flags | {"enable-fp32-lm-head": True, "disable-radix-cache": True}


def command(flags: dict[str, FlagValue], slot: Slot, port: int) -> list[str]:
    """`python -m sglang.launch_server` with the flags; a boolean is a bare switch or left out."""
    owned = {"host": HOST, "port": port, "device": "cpu" if slot.kind == "cpu" else "cuda"}
    cmd = [engine_python(), "-m", "sglang.launch_server"]
    for key, value in (flags | owned).items():
        if value is True:
            cmd.append(f"--{key}")
        elif value is not False:
            cmd += [f"--{key}", str(value)]
    return cmd


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out twice by this process."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise SystemFailed("no free loopback port for the server")


def http_get(port: int, path: str, timeout_s: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class ServerProcess:
    """A server in its own process group, its output in a log file; stopping takes the whole group."""

    def __init__(self, cmd: list[str], tree: Path, slot: Slot, log: Path, pycache: Path | None = None):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log_path, self.cmd, self.slot = log, cmd, slot
        self._log = open(log, "w")  # noqa: SIM115 — closed in stop()
        self._log.write(f"# {shlex.join(cmd)}\n# PYTHONPATH={tree / 'python'}\n")
        self._log.flush()
        env = {k: v for k, v in os.environ.items() if k in PASS_ENV | SGLANG_PASS_ENV}
        env.update(slot.env(), PYTHONPATH=str(tree / "python"), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
        if pycache is not None:
            # Bytecode goes to the cache, keyed by source path: the system's tree stays as exported.
            env["PYTHONPYCACHEPREFIX"] = str(pycache)
        core = slot.index if slot.kind == "cpu" else None
        if core is not None:
            env["OMP_NUM_THREADS"] = "1"
        preexec = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        self.t_start = time.perf_counter()
        try:
            self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, preexec_fn=preexec, start_new_session=True)  # fmt: skip
        except OSError as e:
            self._log.close()
            raise SystemFailed(f"could not start the server ({cmd[0]}): {e}") from None
        self._cpu_s = 0.0

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(ValueError):
            self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def wait_healthy(self, port: int, timeout_s: float) -> None:
        """Poll GET /health until 200 (SGLang answers 503 until its warm-up generate has run)."""
        deadline = time.perf_counter() + timeout_s
        while True:
            code = self.exit_code()
            if code is not None:
                raise SystemFailed(f"server exited with code {code} while loading", self.log_tail())
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise SystemFailed(
                    f"server not healthy within {timeout_s:.0f}s while loading", self.log_tail()
                )
            try:
                # /health runs a one-token generate once the server is up: allow it its time.
                if http_get(port, "/health", min(30.0, max(remaining, 0.1)))[0] == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass  # not listening yet, or closed the connection while starting
            time.sleep(min(0.25, max(deadline - time.perf_counter(), 0)))

    def _group(self) -> list[int]:
        """The pids of every process in the server's process group (it leads its own)."""
        out = []
        for pid in psutil.pids():
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == self.proc.pid:
                    out.append(pid)
        return out

    def usage(self) -> dict:
        """CPU seconds of the whole process group, wall seconds alive, the group's allowed cores."""
        out = {"wall_s": time.perf_counter() - self.t_start, "cpu_s": self._cpu_s, "cores": None}
        group = self._group()
        if group:
            out["cpu_s"] = self._cpu_s = cpu_seconds(group)
            out["cores"] = allowed_cores(group)
        return out

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the group (SGLang shuts its scheduler down), SIGKILL after `grace_s`."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        # The next period starts on this GPU: wait until no process of the group holds it.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        self._log.close()
