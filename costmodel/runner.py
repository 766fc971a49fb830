"""Run a system tree's own profiler and recorder on a device slot (CONTRACTS §4, §5).

The tool runs as `python -m refspec.<tool> --device DEV ...` in a fresh process with the tree
root first on PYTHONPATH, placed like the controller places the serve process: a `cuda:N` slot
sees only GPU N (CUDA_VISIBLE_DEVICES=N, `--device cuda:0`); a `cpu:N` slot sees no GPU and is
pinned to core N from the start (the tool pins itself again; pinning before exec keeps imports
and loading on that core too). The output is written to a temporary name and renamed into place only when the tool exits
0, so a crash never leaves a half-written profile or recording; its stderr is kept beside it.

A tool is a system's own code. Given a `jail` (the controller's: controller.refspec_system.tool_jail),
it runs confined as a served system does: its tree at /system, the request file at /in, a fresh
folder at /out its only writable place besides its scratch, nothing of the SpecPilot home in sight.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from specpilot.deployments import SLOT_RE, Home, SpecPilotError
from specpilot.deployments.stock import tree_files

from .profile import StepProfile, load_profile
from .recording import Record, load_records

DEFAULT_TIMEOUT_S = 3600
IN, OUT = "/in/requests.jsonl", "/out"  # where a confined tool finds its requests and writes its output

# Confines a tool run: (command inside, tree, binds (host path, path inside, "ro" | "rw"), the slot)
# -> a launch (`argv`, `env`, `cleanup()`), the command's model argument given as the model's name.
Jail = Callable[[list[str], Path, list[tuple[Path, str, str]], str], object]


def tree_digest(tree: Path) -> str:
    """A content hash of a source tree (file names and bytes, caches ignored)."""
    h = hashlib.sha256()
    for rel in tree_files(tree):
        h.update(str(rel).encode() + b"\0" + (tree / rel).read_bytes() + b"\0")
    return h.hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def placement(slot: str) -> tuple[str, dict[str, str], object]:
    """(--device argument, environment, pre-exec pinning) for a process on `slot`."""
    m = SLOT_RE.match(slot)
    if not m:
        raise SpecPilotError(f"slot {slot!r} is not of the form 'cpu:N' or 'cuda:N'")
    kind, index = m.group(1), int(m.group(2))
    if kind == "cuda":
        return "cuda:0", {"CUDA_VISIBLE_DEVICES": str(index)}, None
    if index not in os.sched_getaffinity(0):
        raise SpecPilotError(
            f"slot {slot}: CPU core {index} is not available to this process "
            f"(available: {sorted(os.sched_getaffinity(0))})"
        )
    return slot, {"CUDA_VISIBLE_DEVICES": ""}, lambda: os.sched_setaffinity(0, {index})


def run_tool(
    tool: str,
    tree: Path,
    slot: str,
    requests: Path,
    args: list[str],
    out: Path,
    home: Home,
    timeout: float,
    jail: Jail | None = None,
) -> None:
    """Run `refspec.<tool>` from `tree` on `slot` over `requests`, writing `out` atomically;
    confined by `jail` where given."""
    tree, out, requests = Path(tree).resolve(), Path(out).resolve(), Path(requests).resolve()
    if not (tree / "refspec").is_dir():
        raise SpecPilotError(f"{tree} is not a refspec tree (no refspec/ package in it)")
    if tool == "profile" and not (tree / "refspec" / "profile.py").is_file():
        raise SpecPilotError(f"{tree} has no refspec/profile.py: the system cannot profile itself yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    log = out.with_name(out.name + ".log")
    device, slot_env, pin = placement(slot)
    launch = box = None
    if jail is None:
        env = {**os.environ, **slot_env}
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
        env["SPECPILOT_CACHE"] = str(home.cache)
        cmd = [sys.executable, "-m", f"refspec.{tool}", "--device", device, "--requests", str(requests), *args,
               "--out", str(tmp)]  # fmt: skip
        written = tmp
    try:
        if jail is not None:  # the output comes back through a folder of its own, copied into place here
            box = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{tool}-"))
            inside = [sys.executable, "-m", f"refspec.{tool}", "--device", device, "--requests", IN, *args,
                      "--out", f"{OUT}/{tool}.out"]  # fmt: skip
            launch = jail(inside, tree, [(requests, IN, "ro"), (box, OUT, "rw")], slot)
            cmd, env, written = launch.argv, launch.env, box / f"{tool}.out"  # still pinned before exec
        with open(log, "w") as err:
            proc = subprocess.run(
                cmd, stdout=err, stderr=subprocess.STDOUT, env=env, timeout=timeout, preexec_fn=pin
            )
        if launch is not None and proc.returncode == 0 and written.is_file() and not written.is_symlink():
            shutil.copyfile(written, tmp)  # the run's file, read as data, never followed
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise SpecPilotError(f"refspec.{tool} on {slot} ran over {timeout:.0f} s (log: {log})") from None
    finally:
        if launch is not None:
            launch.cleanup()
        if box is not None:
            shutil.rmtree(box, ignore_errors=True)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = log.read_text()[-800:].strip()
        raise SpecPilotError(f"refspec.{tool} on {slot} failed (exit {proc.returncode}, log {log}): {tail}")
    os.replace(tmp, out)


def run_profile(
    tree: Path,
    slot: str,
    requests: Path,
    out: Path,
    home: Home,
    *,
    max_requests: int | None = None,
    model: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    jail: Jail | None = None,
) -> StepProfile:
    """Profile the system at `tree` on `slot` over `requests` (the deployment's `model`; the tree's
    default without one); returns the validated profile."""
    args = [] if max_requests is None else ["--max-requests", str(max_requests)]
    if model is not None:
        args += ["--model", model]
    run_tool("profile", tree, slot, requests, args, out, home, timeout, jail)
    return load_profile(out)


def run_record(
    tree: Path,
    slot: str,
    requests: Path,
    out: Path,
    home: Home,
    *,
    model: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    jail: Jail | None = None,
) -> list[Record]:
    """Record greedy tokens and lattices of the system at `tree` over `requests`."""
    args = [] if model is None else ["--model", model]
    run_tool("record", tree, slot, requests, args, out, home, timeout, jail)
    return load_records(out)


def cached_record(
    tree: Path, slot: str, requests: Path, home: Home, *, model: str | None = None, jail: Jail | None = None
) -> tuple[Path, list[Record]]:
    """A recording of `tree` on `requests`, made once: greedy tokens and lattices depend only on
    the tree's code, the model, the requests and the device kind, so it is cached under the home by their hashes."""
    kind = slot.split(":")[0]  # greedy tokens may differ between CPU and GPU numerics
    key = f"{tree_digest(Path(tree))[:16]}-{file_digest(requests)[:16]}-{model or 'default'}-{kind}"
    out = home.cache / "records" / f"{key}.jsonl"
    if out.is_file():
        return out, load_records(out)
    return out, run_record(tree, slot, requests, out, home, model=model, jail=jail)
