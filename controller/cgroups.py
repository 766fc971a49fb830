"""A system's own cgroup: pinned to its cores (cpuset), frozen while it waits its turn, its CPU
time counted over its whole process tree.

Unlike an affinity mask, a cpuset cannot be widened by the process inside it, so a system cannot
borrow the other slot's core even for a moment; a frozen cgroup runs nothing at all, which a
SIGSTOP to one process group does not guarantee. cgroup v2 (the unified hierarchy, when the
controller's own cgroup is its root) and v1 (cpuset, freezer and cpuacct hierarchies) are both
used where writable; where neither is (no root, no delegation), `create` returns None and the
controller falls back to affinity, process-group signals and /proc accounting, saying so in the
evidence.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

V1 = Path("/sys/fs/cgroup")


def _mounts() -> dict[str, Path]:
    """cgroup mount points by kind: 'v2', or a v1 controller name."""
    out: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, where, fstype, opts, *_ = line.split()
            if fstype == "cgroup2":
                out.setdefault("v2", Path(where))
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    if opt in ("cpuset", "freezer", "cpuacct"):
                        out[opt] = Path(where)
    return out


def _own(kind: str) -> str | None:
    """This process's cgroup path in a hierarchy ('' = v2, else the v1 controller)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if (kind == "" and ctrls == "") or kind in ctrls.split(","):
                return path
    return None


@dataclass
class Cgroup:
    """One system's cgroup(s); `procs` are the files its launcher writes its pid into."""

    version: int
    dirs: dict[str, Path]  # role (cpuset, freezer, cpuacct; v2: all) -> folder
    procs: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, cpus: set[int] | None) -> Cgroup | None:
        """A new cgroup limited to `cpus` (None: no cpuset), or None where none can be made."""
        name = f"specpilot-{uuid.uuid4().hex[:12]}"
        mounts = _mounts()
        try:
            if {"cpuset", "freezer", "cpuacct"} <= set(mounts):
                return cls._v1(mounts, name, cpus)
            if "v2" in mounts and _own("") == "/":
                return cls._v2(mounts["v2"], name, cpus)
        except OSError:
            return None
        return None

    @classmethod
    def _v1(cls, mounts: dict[str, Path], name: str, cpus: set[int] | None) -> Cgroup:
        dirs = {}
        try:
            for ctrl in ("cpuset", "freezer", "cpuacct"):
                parent = mounts[ctrl] / (_own(ctrl) or "/").lstrip("/")
                d = parent / name
                d.mkdir()
                dirs[ctrl] = d
                if ctrl == "cpuset":  # a v1 cpuset starts empty: both files must be set before any task
                    (d / "cpuset.mems").write_text((parent / "cpuset.mems").read_text())
                    want = ",".join(map(str, sorted(cpus))) if cpus else (parent / "cpuset.cpus").read_text()
                    (d / "cpuset.cpus").write_text(want)
        except OSError:
            cls(1, dirs).remove()
            raise
        return cls(1, dirs, [str(d / "cgroup.procs") for d in dirs.values()])

    @classmethod
    def _v2(cls, root: Path, name: str, cpus: set[int] | None) -> Cgroup:
        if cpus:
            if "cpuset" not in (root / "cgroup.controllers").read_text().split():
                raise OSError("no cpuset controller")
            (root / "cgroup.subtree_control").write_text("+cpuset")
        d = root / name
        d.mkdir()
        try:
            if cpus:
                (d / "cpuset.cpus").write_text(",".join(map(str, sorted(cpus))))
        except OSError:
            d.rmdir()
            raise
        return cls(2, {"cpuset": d, "freezer": d, "cpuacct": d}, [str(d / "cgroup.procs")])

    def freeze(self, on: bool, timeout_s: float = 5.0) -> None:
        """Stop (or resume) every task of the cgroup, and wait until the kernel says it is so."""
        d = self.dirs["freezer"]
        if self.version == 2:
            (d / "cgroup.freeze").write_text("1" if on else "0")
            want, state = ("frozen 1" if on else "frozen 0"), d / "cgroup.events"
        else:
            (d / "freezer.state").write_text("FROZEN" if on else "THAWED")
            want, state = ("FROZEN" if on else "THAWED"), d / "freezer.state"
        deadline = time.monotonic() + timeout_s
        while want not in state.read_text():
            if time.monotonic() > deadline:
                raise OSError(f"cgroup {d.name} did not become {'frozen' if on else 'thawed'}")
            time.sleep(0.002)

    def cpu_seconds(self) -> float:
        """CPU time of every task that ever ran in the cgroup (threads and children included)."""
        d = self.dirs["cpuacct"]
        if self.version == 2:
            usage = next(
                ln for ln in (d / "cpu.stat").read_text().splitlines() if ln.startswith("usage_usec")
            )
            return int(usage.split()[1]) / 1e6
        return int((d / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError, KeyError):  # KeyError: a v1 set left half made
            return [int(p) for p in (self.dirs["cpuacct"] / "cgroup.procs").read_text().split()]
        return []

    def remove(self) -> None:
        """Kill what is left inside and remove the folders (a cgroup with tasks cannot go)."""
        with contextlib.suppress(OSError, KeyError):
            self.freeze(False, timeout_s=1.0)
        for _ in range(200):
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
            time.sleep(0.01)
        for d in set(self.dirs.values()):
            with contextlib.suppress(OSError):
                d.rmdir()
