"""Start one system confined: `python -I jail.py SPEC.json -- COMMAND...` (Linux; standard library only).

The controller runs every system through this launcher, so a system under judgement
- sees no other process (its own PID namespace; signals and ptrace reach nothing outside it),
- sees the machine read-only, with a private /tmp, /var/tmp, /dev/shm, /run and /scratch (its
  home) that vanish when it exits, and without the SpecPilot home (database, raw runs, request files, workspaces,
  the other system's export): `hide` covers each such path with an empty, unreadable folder,
- finds its own tree, the target's weights and its compile cache at the same neutral paths in
  every run (`binds`, e.g. /system, /cache/models/<name>), so a judged run looks like any other,
- has no network unless `net` (its own network namespace: loopback only),
- runs as an unprivileged user of its own: as root, this run's own `uid`/`gid` (drawn afresh for
  every run); in both modes inside a user namespace of its own, made for this run, whose root has
  dropped every capability; with a session keyring of its own, no way to regain privileges, a cap
  on the size of any file it writes (`fsize`), and is placed in its cgroups (`cgroups`: files to
  write its pid into) before any of its code runs. So nothing the kernel keys by user or by
  namespace (user and persistent keyrings, SysV IPC and POSIX queues, abstract sockets, the
  network) is shared with another system, another period or a later run.
The launcher stays outside as the namespace's parent, and outside the cgroups, so it is never
frozen: when the controller dies (or stops it), it thaws the cgroups and kills the namespace, so a
system frozen in its turn does not outlive the controller. The namespace's first process reaps
orphans and exits with the system's status. Every failure to set up is one line on stderr and
exit 121.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import resource
import select
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)  # fmt: skip
MNT_DETACH, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MS_MOVE = 2, 0x8000, 1, 8192
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_DUMPABLE = 1, 38, 24, 28, 4
KEYCTL_JOIN_SESSION_KEYRING = 1
SECURE_ALL = 0x2F  # NOROOT, NOROOT_LOCKED, NO_SETUID_FIXUP_LOCKED, KEEP_CAPS_LOCKED
SYS = {
    "x86_64": {"pivot_root": 155, "capset": 126, "keyctl": 250, "add_key": 248, "request_key": 249},
    "aarch64": {"pivot_root": 41, "capset": 91, "keyctl": 219, "add_key": 217, "request_key": 218},
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Kernel keys are one store for the whole machine, found by serial from any namespace: a system
# gets none (ENOSYS, as on a kernel built without them).
NO_SYSCALLS = ("add_key", "keyctl", "request_key")
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (Linux >= 5.12)
SETUP_FAILED = 121
# Top-level folders the new root does not take from the machine: fresh mounts or private tmpfs.
FRESH = {"proc", "sys", "dev", "tmp", "run", "mnt", "media", "lost+found", "var", "boot",
         "system", "cache", "scratch"}  # fmt: skip  # the last three: where a system finds its files
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch")  # HOME is /scratch/home

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(
        libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}"
    )


def read_only(target: str) -> None:
    """Make a bind mount and every mount below it read-only."""

    class Attr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64), ("prop", ctypes.c_uint64),
                    ("userns", ctypes.c_uint64)]  # fmt: skip

    attr = Attr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = libc.syscall(
        SYS_MOUNT_SETATTR, -100, target.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if ret != 0:  # an older kernel: remount each mount below the target on its own
        with open("/proc/self/mountinfo") as f:
            below = [line.split()[4] for line in f]
        for m in [m for m in below if m == target or m.startswith(target.rstrip("/") + "/")]:
            _check(libc.mount(None, m.encode(), None, ctypes.c_ulong(MS_BIND | MS_REMOUNT | MS_RDONLY), None),
                   f"remount {m} read-only")  # fmt: skip


def bind(src: str, target: str, ro: bool) -> None:
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(src, target, None, MS_BIND | MS_REC)
    if ro:
        read_only(target)


def tmpfs(target: str, size: str = "512m", mode: str = "1777") -> None:
    os.makedirs(target, exist_ok=True)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")


DEVICES = ("null", "zero", "full", "random", "urandom")  # plus every /dev/nvidia* node (the GPU)


def build_dev(new: str) -> None:
    """A minimal /dev: the harmless nodes, the GPU's, /dev/shm private (no disks, no /dev/kmsg)."""
    os.makedirs(new + "/dev", exist_ok=True)
    mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID, "size=1m,mode=755")
    for name in [*DEVICES, *sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))]:
        if os.path.exists("/dev/" + name):
            bind("/dev/" + name, f"{new}/dev/{name}", ro=False)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.symlink("/proc/self/fd", new + "/dev/fd")


def build_root(spec: dict) -> None:
    """The new root: the machine read-only, private scratch places, the binds, the hidden paths.

    A top-level folder others may not enter (like /root, mode 700) is replaced by an empty one
    holding only the `expose` paths under it (the interpreter's install, say), read-only; so is a
    private scratch place (an interpreter installed under /tmp stays visible, read-only).
    """
    new = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new, "tmpfs", MS_NOSUID, "size=16m,mode=755")
    for name in sorted(os.listdir("/")):
        src, dst = "/" + name, os.path.join(new, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif not os.path.isdir(src) or name in FRESH:
            continue
        elif os.stat(src).st_mode & 0o001:
            bind(src, dst, ro=True)
        else:
            tmpfs(dst, size="1m", mode="755")
            for path in spec.get("expose", []):
                if path.startswith(src + "/") and os.path.exists(path):
                    bind(path, new + path, ro=True)
    bind("/var", new + "/var", ro=True)
    bind("/sys", new + "/sys", ro=True)
    build_dev(new)
    os.makedirs(new + "/proc", exist_ok=True)
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in PRIVATE:
        if os.path.isdir(new + os.path.dirname(path)):
            tmpfs(new + path)
            for keep in spec.get("expose", []):  # an interpreter installed under /tmp, say
                if keep.startswith(path + "/") and os.path.isdir(keep):
                    os.makedirs(new + keep, exist_ok=True)
                    bind(keep, new + keep, ro=True)
    for path in spec.get("hide", []):
        if os.path.isdir(new + path):
            tmpfs(new + path, size="4k", mode="000")
    for src, dst, mode in spec.get("binds", []):
        bind(src, new + dst, ro=mode == "ro")
    os.makedirs(new + spec["home"], exist_ok=True)
    if spec.get("uid") is not None:
        os.chown(new + spec["home"], spec["uid"], spec["gid"])
    old = new + "/.old-root"
    os.makedirs(old, exist_ok=True)
    if libc.syscall(SYS[platform.machine()]["pivot_root"], new.encode(), old.encode()) == 0:
        os.chdir("/")
        _check(libc.umount2(b"/.old-root", MNT_DETACH), "detach the old root")
        os.rmdir("/.old-root")
    else:  # the machine's root is an initramfs, where pivot_root is refused: move the new root over it
        os.rmdir(old)
        os.chdir(new)
        mount(new, "/", None, MS_MOVE)
        os.chroot(".")  # no way back out: the system runs without the privilege chroot needs
        os.chdir("/")


def own_user_namespace() -> None:
    """Enter a user namespace made for this run, its root mapped to the current user alone: what
    the kernel keeps per user and namespace (the user and persistent keyrings above all) starts
    empty and dies with the run."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER), "unshare (user namespace)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def deny_syscalls(names: tuple[str, ...]) -> None:
    """A seccomp filter, inherited by everything the system starts: `names` fail with ENOSYS, a
    call of another architecture's ABI (x32 numbers, say) kills the process, the rest runs."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]  # fmt: skip

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, kill, enosys = 0x7FFF0000, 0x80000000, 0x00050000 | errno.ENOSYS
    nrs = [SYS[platform.machine()][n] for n in names]
    n = len(nrs)  # jumps count from the next instruction; the three returns close the program
    code = [(ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH[platform.machine()]), (ret, 0, 0, kill),  # arch
            (ld, 0, 0, 0), (jge, n + 1, 0, 0x40000000)]  # fmt: skip  # the number; x32's: to kill
    code += [(jeq, n + 1 - i, 0, nr) for i, nr in enumerate(nrs)]  # to ENOSYS
    code += [(ret, 0, 0, allow), (ret, 0, 0, kill), (ret, 0, 0, enosys)]
    prog = (Filter * len(code))(*[Filter(*c) for c in code])
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Prog(len(code), prog)), 0, 0),
           "seccomp filter")  # fmt: skip


def drop_privileges(spec: dict, userns: bool) -> None:
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if not userns:  # root: become this run's own user first
        groups = [g for g in spec.get("groups", []) if g]
        os.setgroups(groups)
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")  # to write its own /proc/self/*_map
    own_user_namespace()
    # A session keyring of its own: the one inherited from the controller is shared by every run.
    joined = libc.syscall(SYS[platform.machine()]["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None)
    if joined < 0 and ctypes.get_errno() != errno.ENOSYS:  # a kernel without keys has none to share
        raise SetupError(f"join a fresh session keyring: {os.strerror(ctypes.get_errno())}")
    deny_syscalls(NO_SYSCALLS)
    # Root of that namespace: keep uid 0 inside it, but with no capability and no way back.
    _check(libc.prctl(PR_SET_SECUREBITS, SECURE_ALL, 0, 0, 0), "securebits")
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]  # fmt: skip

    data = (Data * 2)()
    _check(
        libc.syscall(SYS[platform.machine()]["capset"], ctypes.byref(Header(0x20080522, 0)), data), "capset"
    )


def _open_cgroups(procs_files: list[str]) -> list[tuple[tuple[int, bytes] | None, int, str]]:
    """Handles on the system's cgroups — (freeze file and its thaw value, parent folder, name) —
    opened now: the namespace's new root replaces this process's view of the machine too."""
    out = []
    for procs in procs_files:
        folder = os.path.dirname(procs)
        freeze = None
        for name, thawed in (("freezer.state", b"THAWED"), ("cgroup.freeze", b"0")):
            with contextlib.suppress(OSError):
                freeze = (os.open(os.path.join(folder, name), os.O_WRONLY), thawed)
                break
        parent = os.open(os.path.dirname(folder), os.O_RDONLY | os.O_DIRECTORY)
        out.append((freeze, parent, os.path.basename(folder)))
    return out


def _thaw(handles: list) -> None:
    """Thaw the cgroups (a frozen task dies only once thawed, in cgroup v1)."""
    for freeze, _, _ in handles:
        if freeze is not None:
            with contextlib.suppress(OSError):
                os.write(*freeze)


def _remove(handles: list, wait_s: float = 2.0) -> None:
    """Remove the emptied cgroups (when no controller is left to), once the namespace's last
    processes, reparented here, are reaped."""
    left, deadline = list(handles), time.monotonic() + wait_s
    while left and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        for h in list(left):
            with contextlib.suppress(OSError):
                os.rmdir(h[2], dir_fd=h[1])
                left.remove(h)
        if left:
            time.sleep(0.05)


def _code(status: int) -> int:
    """A shell-style exit code: the exit status, or 128 + the signal that ended the process."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] == "--" or "--" not in argv:
        print("usage: jail.py SPEC.json -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    cmd = argv[argv.index("--") + 1 :]
    userns = os.geteuid() != 0
    if userns:  # one mapped user: the namespace's root, which drops every capability
        spec["uid"] = spec["gid"] = None
    try:
        # The controller died: with cgroups, SIGTERM (thaw, then kill: `stop` below); without,
        # SIGKILL (a SIGSTOPped launcher could not run a handler; the namespace dies with it).
        death = signal.SIGTERM if spec.get("cgroups") else signal.SIGKILL
        controller = os.getppid()
        libc.prctl(PR_SET_PDEATHSIG, death, 0, 0, 0)
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        flags |= 0 if spec.get("net") else CLONE_NEWNET
        uid, gid = os.getuid(), os.getgid()
        _check(libc.unshare(flags | (CLONE_NEWUSER if userns else 0)), "unshare (namespaces)")
        if userns:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"0 {gid} 1")
    except (OSError, SetupError) as e:
        print(f"jail: {e}", file=sys.stderr)
        return SETUP_FAILED
    try:
        handles = _open_cgroups(spec.get("cgroups", []))
    except OSError as e:
        print(f"jail: cgroup: {e}", file=sys.stderr)
        return SETUP_FAILED
    placed_r, placed_w = os.pipe()
    child = os.fork()
    if child:  # outside: place the namespace in the cgroups, forward termination, report the status
        os.close(placed_r)

        def stop(_sig, _frame) -> None:
            _thaw(handles)
            os.kill(child, signal.SIGKILL)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)
        try:
            for procs in spec.get("cgroups", []):
                with open(procs, "w") as f:
                    f.write(str(child))
        except OSError as e:
            print(f"jail: cgroup: {e}", file=sys.stderr)
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return SETUP_FAILED
        os.write(placed_w, b"1")  # and placed_w stays open while the launcher lives (see below)
        if os.getppid() != controller:  # it died before the death signal was armed
            stop(None, None)
        status = os.waitpid(child, 0)[1]
        if os.getppid() != controller:  # no one is left to remove the emptied cgroups
            _remove(handles)
        return _code(status)
    os.close(placed_w)
    for freeze, parent, _ in handles:  # the launcher's: a handle kept here could reach the cgroups
        os.close(parent)
        if freeze is not None:
            os.close(freeze[0])
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # before the wait: the launcher may die in it
    if os.read(placed_r, 1) != b"1":  # the launcher failed to place us: nothing of the system runs
        os._exit(SETUP_FAILED)
    try:  # PID 1 of the new namespace
        build_root(spec)
        libc.sethostname(b"system", 6)
        os.chdir(spec.get("cwd", "/"))
        fsize = int(spec.get("fsize", 0))
        if fsize:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        drop_privileges(spec, userns)
        # Becoming the run's own user cleared the death signal (the kernel clears it on any change
        # of uid or gid): armed again, then the launcher's end of `placed` is checked, since it may
        # have died in between (getppid() is 0 across the namespace's border).
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if select.select([placed_r], [], [], 0)[0]:  # end of file: the launcher is gone
            os._exit(SETUP_FAILED)
    except (OSError, SetupError) as e:
        print(f"jail: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    system = os.fork()
    if system == 0:
        try:
            os.execve(cmd[0], cmd, spec.get("env", {}))
        except OSError as e:
            print(f"jail: cannot run {cmd[0]}: {e}", file=sys.stderr)
            os._exit(SETUP_FAILED)
    while True:  # reap everything; leave with the system's status (the namespace dies with us)
        pid, status = os.wait()
        if pid == system:
            os._exit(_code(status))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
