"""No state outlives a confined run, and none passes between two runs side by side (jail.py).

A writer run tries to leave a message in every kernel object a system could reach — the user,
user-session, session and persistent keyrings, SysV shared memory, message queues and semaphores, a
POSIX message queue, an abstract and a loopback socket, its private folders — and tells the host
where (key serials, IPC ids). (Kernel keys are refused outright: the key store is one for the
whole machine, and a key is found by its serial from any namespace.) A reader run, first beside the live writer and then after it exited, looks for
each, told exactly where to look; it must find nothing. Real namespaces, real kernel objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specpilot.controller.confine import RUN_UIDS, confine
from specpilot.deployments import Home
from tests.controller.confinement import needs_confinement

pytestmark = needs_confinement

PROBE = r"""
import ctypes, json, os, platform, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
N = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}[platform.machine()]
KEYRINGS = {"user": -4, "user_session": -5, "session": -3}
SEARCH, READ, SETPERM, GET_PERSISTENT = 10, 11, 5, 22
SYSV_KEY, IPC_CREAT = 0x5350, 0o1000
MSG = b"answers from an earlier run"
mode = sys.argv[1]
out = {}

def err():
    return os.strerror(ctypes.get_errno())

def keyctl(*args):
    return libc.syscall(N["keyctl"], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])

def persistent():
    return keyctl(GET_PERSISTENT, -1, -2)  # this user's persistent keyring, linked to the process keyring

if mode == "write":
    for name, ring in [*KEYRINGS.items(), ("persistent", None)]:
        ring = persistent() if ring is None else ring
        serial = libc.syscall(N["add_key"], b"user", b"specpilot-probe", MSG, ctypes.c_size_t(len(MSG)), ctypes.c_long(ring))
        if serial > 0:
            keyctl(SETPERM, serial, 0x3f3f3f3f)  # readable by anyone who can find it
        out["key_" + name] = serial if serial > 0 else err()
    shm = libc.shmget(SYSV_KEY, 4096, IPC_CREAT | 0o666)
    out["shm"] = shm if shm >= 0 else err()
    out["msg"] = libc.msgget(SYSV_KEY, IPC_CREAT | 0o666)
    out["sem"] = libc.semget(SYSV_KEY, 1, IPC_CREAT | 0o666)
    mq = libc.mq_open(b"/specpilot-probe", os.O_CREAT | os.O_RDWR, 0o666, None)
    out["mq"] = mq if mq >= 0 else err()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0specpilot-probe")
    abstract.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    out["port"] = tcp.getsockname()[1]
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/scratch/home"):
        try:
            open(d + "/specpilot-probe", "wb").write(MSG)
            out["file " + d] = "ok"
        except OSError as e:
            out["file " + d] = str(e)
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # alive until the host closes our input
else:
    told = json.loads(sys.argv[2])
    found = {}
    buf = ctypes.create_string_buffer(256)
    for name, ring in [*KEYRINGS.items(), ("persistent", None)]:
        ring = persistent() if ring is None else ring
        s = keyctl(SEARCH, ring, b"user", b"specpilot-probe", 0)
        if s > 0:
            found["search " + name] = s
        serial = told.get("key_" + name)
        if isinstance(serial, int) and keyctl(READ, serial, buf, 256) > 0:
            found["read key " + name] = buf.value.decode(errors="replace")
    keys = open("/proc/keys").read() if os.path.exists("/proc/keys") else ""
    if "specpilot-probe" in keys:
        found["/proc/keys"] = keys
    if libc.shmget(SYSV_KEY, 0, 0) >= 0 or (isinstance(told.get("shm"), int) and libc.shmat(told["shm"], None, 0) not in (None, -1, 2**64 - 1)):
        found["shm"] = True
    if libc.msgget(SYSV_KEY, 0) >= 0:
        found["msg"] = True
    if libc.semget(SYSV_KEY, 0, 0) >= 0:
        found["sem"] = True
    if libc.mq_open(b"/specpilot-probe", os.O_RDONLY) >= 0:
        found["mq"] = True
    for family, addr in ((socket.AF_UNIX, "\0specpilot-probe"), (socket.AF_INET, ("127.0.0.1", told["port"]))):
        try:
            socket.socket(family).connect(addr)
            found["socket " + str(addr)] = True
        except OSError:
            pass
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/scratch/home"):
        if os.path.exists(d + "/specpilot-probe"):
            found["file " + d] = True
    out["found"] = found
    out["uid_map"] = open("/proc/self/uid_map").read().split()
    print(json.dumps(out), flush=True)
"""


def _launch(home: Home, tree: Path, *args: str):
    launch = confine([sys.executable, "-I", "/system/probe.py", *args], tree=tree, binds=[], home=home,
                     env={"PATH": "/usr/bin:/bin"}, cpus=None)  # fmt: skip
    return launch, subprocess.Popen(launch.argv, env=launch.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip


def _read(home: Home, tree: Path, told: dict) -> dict:
    launch, proc = _launch(home, tree, "read", json.dumps(told))
    try:
        out, errs = proc.communicate(timeout=60)
    finally:
        launch.cleanup()
    assert proc.returncode == 0, errs
    return json.loads(out)


def test_no_kernel_object_passes_state_between_runs(tmp_path: Path):
    home = Home(tmp_path / "home")
    home.root.mkdir(parents=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "probe.py").write_text(PROBE)
    launch, writer = _launch(home, tree, "write")
    try:
        told = json.loads(writer.stdout.readline() or "{}")
        assert told, f"the writer did not report: {writer.stderr.read() if writer.poll() is not None else ''}"
        # Kernel keys are one store for the machine (found by serial from anywhere): a system has none.
        assert all(
            told["key_" + k] == "Function not implemented" for k in ("user", "session", "persistent")
        ), told
        # What the kernel keeps per namespace the writer may use: it is its own.
        assert told["shm"] >= 0 and told["msg"] >= 0 and told["sem"] >= 0 and told["mq"] >= 0, told
        assert told["file /tmp"] == told["file /dev/shm"] == told["file /scratch/home"] == "ok", told
        beside = _read(home, tree, told)
        assert beside["found"] == {}, f"a run beside the writer reached its state: {beside['found']}"
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
        launch.cleanup()
    after = _read(home, tree, told)
    assert after["found"] == {}, f"a later run reached the writer's state: {after['found']}"
    if os.geteuid() == 0:  # every run is a user of its own on the host
        uids = {int(beside["uid_map"][1]), int(after["uid_map"][1])}
        assert len(uids) == 2 and all(RUN_UIDS[0] <= u < RUN_UIDS[1] for u in uids), uids
