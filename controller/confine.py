"""Every system the controller starts runs confined (jail.py), at the same neutral paths each time.

Inside, a system finds its own tree at /system (read-only), the target's weights at
/cache/models/<name> (read-only), its compile cache at /cache/compile (writable only in the untimed
prepare run, whose weights are a decoy of random values with the real shapes, so nothing it
computes there can be an output), HOME in a private /scratch, and nothing of the SpecPilot home:
no database, no raw runs, no request files, no other system's export. Every run is its own
unprivileged user (a fresh uid as root) in namespaces of its own, its user namespace included (no other process in sight, no network) and, where the
machine allows, in its own cgroup (its cores only, frozen while it waits its turn, its CPU time
counted over every thread and child).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from specpilot.deployments import Home, SpecPilotError

from .cgroups import Cgroup

JAIL = Path(__file__).resolve().parent / "jail.py"
SYSTEM = "/system"
CACHE = "/cache"
HOME_IN = "/scratch/home"
# As root, every run is a user of its own, drawn afresh from this range (no account uses it), so
# nothing the kernel keeps per user outlives the run for a later one to find.
RUN_UIDS = (1 << 24, 1 << 31)
FSIZE = 256 << 20  # the largest file a system may write (its log included)


NO_CGROUP = (
    "no cgroup can be made here (/sys/fs/cgroup is not writable, or lacks cpuset, freezer and cpuacct), so "
    "a system's helpers could compute off its cores and outside its turn unseen, and the controller will "
    "not judge: run as root where /sys/fs/cgroup is writable (cgroup v2 with this process at its root, "
    'or v1 cpuset+freezer+cpuacct), or set controller.cgroups = "optional" in the deployment to judge '
    "without them, every verdict saying so"
)


def fresh_uid() -> int:
    """A user id no account and no live process holds: this run's own."""
    rng = random.SystemRandom()
    while True:
        uid = rng.randrange(*RUN_UIDS)
        with contextlib.suppress(KeyError):
            pwd.getpwuid(uid)
            continue
        # process_iter with attrs skips a process that exits meanwhile (uids None where unreadable)
        if not any(p.info["uids"] and p.info["uids"].real == uid for p in psutil.process_iter(["uids"])):
            return uid


@dataclass
class Launch:
    """A confined command: argv for Popen, its spec file and its cgroup (None where unavailable)."""

    argv: list[str]
    spec_path: Path
    cgroup: Cgroup | None
    env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None  # the run's own user on the host (root mode), None when unprivileged

    def cleanup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.spec_path.parent, ignore_errors=True)


def _expose() -> list[str]:
    """Where this interpreter lives: kept visible even under a folder others may not enter."""
    paths = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(p for p in paths if p and p != "/")


def _device_groups() -> list[int]:
    """The groups owning the GPU's device nodes, so the unprivileged user may open them."""
    dev = Path("/dev")
    return sorted({p.stat().st_gid for p in dev.glob("nvidia*") if p.exists()} - {0})


def confine(cmd: list[str], *, tree: Path, binds: list[tuple[Path, str, str]], home: Home,
            env: dict[str, str], cpus: set[int] | None, cgroups: str = "required") -> Launch:  # fmt: skip
    """The launcher command that runs `cmd` confined, with `tree` at /system and `binds` (src, dst, ro|rw).
    `cgroups`: "required" refuses where no cgroup can be made; "optional" runs without one."""
    check_available()
    for src in [tree, *(s for s, _, _ in binds)]:
        share(src)
    work = Path(tempfile.mkdtemp(prefix="specpilot-jail-"))
    os.chmod(work, 0o755)
    (work / "root").mkdir()
    uid = fresh_uid() if os.geteuid() == 0 else None
    hide = sorted({str(home.root.resolve()), str(home.cache.resolve())})
    spec = {
        "root": str(work / "root"),
        "binds": [[str(tree), SYSTEM, "ro"], *([str(s), d, m] for s, d, m in binds)],
        "hide": hide,
        "expose": _expose(),
        "uid": uid,
        "gid": uid,
        "groups": _device_groups(),
        "home": HOME_IN,
        "cwd": SYSTEM,
        "fsize": FSIZE,
        "env": env | {"HOME": HOME_IN, "TMPDIR": "/tmp", "USER": "system", "LOGNAME": "system"},
    }
    cgroup = Cgroup.create(cpus)
    if cgroup is None and cgroups == "required":
        shutil.rmtree(work, ignore_errors=True)
        raise SpecPilotError(NO_CGROUP)
    if cgroup is not None:
        spec["cgroups"] = cgroup.procs
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    return Launch(
        [sys.executable, "-I", str(JAIL), str(spec_path), "--", *cmd], spec_path, cgroup, spec["env"], uid
    )


def share(path: Path) -> None:
    """Let the systems' users read what they are handed (an export, the weights, a compile cache):
    folders o+rx, files o+r. Folders the controller makes with mkdtemp are private otherwise."""
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        want = mode | (0o005 if p.is_dir() else 0o004)
        if want != mode:
            p.chmod(want)


def hand_to(path: Path, launch: Launch) -> None:
    """Give a folder (a compile cache about to be prepared) to the user of the run `launch` starts."""
    uid = launch.uid
    if uid is None:
        return  # unprivileged controller: systems run as this same user (in a user namespace)
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, uid, follow_symlinks=False)


def take_back(path: Path) -> None:
    """Take a prepared folder back: owned by the controller, readable by every system, writable by none."""
    for p in [path, *path.rglob("*")]:
        if p.is_symlink():
            p.unlink()  # a link could point anywhere in a later reader's view
            continue
        if os.geteuid() == 0:
            os.chown(p, 0, 0)
        p.chmod(0o755 if p.is_dir() else 0o644)


@functools.cache
def check_available() -> None:
    """Refuse, once and clearly, on a machine where systems cannot be confined."""
    if sys.platform != "linux":
        raise SpecPilotError("the controller confines systems with Linux namespaces; run it on Linux")
    work = Path(tempfile.mkdtemp(prefix="specpilot-jail-check-"))
    try:
        (work / "root").mkdir()
        spec = {"root": str(work / "root"), "hide": [], "expose": _expose(), "uid": RUN_UIDS[0], "gid": RUN_UIDS[0],
                "home": HOME_IN, "env": {"PATH": "/usr/bin:/bin"}}  # fmt: skip
        (work / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, "-I", str(JAIL), str(work / "spec.json"), "--", sys.executable,
                               "-I", "-c", "pass"], capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        raise SpecPilotError(
            f"this machine cannot confine a system ({proc.stderr.strip() or f'exit {proc.returncode}'}), so the "
            "controller will not judge: every system runs in namespaces of its own, a user namespace included "
            "(as root too), under a seccomp filter; allow user namespaces (sysctl user.max_user_namespaces > 0, "
            "kernel.unprivileged_userns_clone=1) on a kernel with seccomp, and run as root or as a normal user"
        )
