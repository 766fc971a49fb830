"""Confinement of a system (jail.py, confine.py, cgroups.py): real namespaces, real cgroups.

A probe program runs confined the way the controller runs every system and reports what it can
see and do; the host checks the other side. Skipped, saying so, where the machine cannot confine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specpilot.controller.cgroups import Cgroup
from specpilot.controller.confine import FSIZE, RUN_UIDS, _expose, confine
from specpilot.deployments import Home
from tests.controller.confinement import left_behind, needs_confinement, proc_state

pytestmark = needs_confinement


def _cgroups_writable() -> bool:
    cg = Cgroup.create(None)
    if cg is not None:
        cg.remove()
    return cg is not None


CGROUPS = _cgroups_writable()

PROBE = r"""
import json, os, signal, socket, sys
out = {"uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read().split(), "pid": os.getpid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "cwd": os.getcwd(), "home": os.environ.get("HOME"), "tmp": os.listdir("/tmp"), "system": sorted(os.listdir("/system")),
       "affinity": sorted(os.sched_getaffinity(0))}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as e:
        out[name] = type(e).__name__ + ": " + (e.strerror or "")
attempt("write_system", lambda: open("/system/x", "w").write("x"))
attempt("write_host", lambda: open(sys.argv[1] + "/x", "w").write("x"))
attempt("read_hidden", lambda: os.listdir(sys.argv[2]))
attempt("kill_host", lambda: os.kill(int(sys.argv[3]), signal.SIGSTOP))
attempt("net", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[4])), timeout=1))
attempt("keep_state", lambda: open("/tmp/state", "w").write("from an earlier period"))
attempt("widen_affinity", lambda: os.sched_setaffinity(0, set(range(os.cpu_count()))))
out["affinity_after"] = sorted(os.sched_getaffinity(0))
def init_fds():
    out["init_fds"] = [os.readlink("/proc/1/fd/" + f) for f in os.listdir("/proc/1/fd")]
attempt("read_init_fds", init_fds)
print(json.dumps(out))
"""


@pytest.fixture
def world(tmp_path: Path):
    home = Home(tmp_path / "home")
    (home.root / "runs").mkdir(parents=True)
    (home.root / "runs" / "secret.jsonl").write_text("the other system's outputs\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "probe.py").write_text(PROBE)
    writable = tmp_path / "host-dir"
    writable.mkdir()
    os.chmod(writable, 0o777)  # world-writable on the host: the confined system must still not write it
    return home, tree, writable


def run_probe(home: Home, tree: Path, writable: Path, cpus: set[int] | None = None) -> dict:
    victim = subprocess.Popen(["sleep", "30"])
    server = __import__("socket").socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        launch = confine([sys.executable, "-I", "/system/probe.py", str(writable), str(home.root), str(victim.pid),
                          str(server.getsockname()[1])], tree=tree, binds=[], home=home,
                         env={"PATH": "/usr/bin:/bin"}, cpus=cpus)  # fmt: skip
        try:
            proc = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
        finally:
            launch.cleanup()
        assert proc.returncode == 0, proc.stderr
        assert victim.poll() is None and proc_state(victim.pid) != "T", (
            "the confined system stopped a host process"
        )
        return json.loads(proc.stdout)
    finally:
        victim.kill()
        server.close()


def test_a_confined_system_sees_nothing_and_touches_nothing(world):
    home, tree, writable = world
    got = run_probe(home, tree, writable)
    assert got["pids"] == [1, 2] and got["pid"] == 2, "only its own namespace's init and itself"
    # /tmp is private: empty but for the interpreter's own install, when that lies under /tmp
    under_tmp = {Path(p).parts[2] for p in _expose() if p.startswith("/tmp/")}
    assert got["cwd"] == "/system" and got["home"] == "/scratch/home" and set(got["tmp"]) == under_tmp
    assert got["system"] == ["probe.py"]
    assert got["uid"] == 0 and got["uid_map"][0] == "0", "the root of a user namespace of its own ..."
    if os.geteuid() == 0:  # ... mapped to a user of its own on the host
        assert RUN_UIDS[0] <= int(got["uid_map"][1]) < RUN_UIDS[1] and got["uid_map"][2] == "1"
    assert got["write_system"].startswith("OSError: Read-only file system"), got["write_system"]
    assert got["write_host"] != "ok", "a world-writable host folder is out of reach (read-only or not there)"
    assert got["read_hidden"] != "ok", "the SpecPilot home is out of sight"
    assert not (writable / "x").exists()
    assert got["kill_host"].startswith("ProcessLookupError"), "a host pid means nothing inside"
    assert got["net"].startswith(("ConnectionRefusedError", "OSError")), (
        "no network: not even the host's loopback"
    )
    assert got["keep_state"] == "ok"  # its own /tmp ...
    again = run_probe(home, tree, writable)
    assert set(again["tmp"]) == under_tmp, "... is gone for the next run"


def test_the_hidden_home_is_empty_inside(world, tmp_path):
    home, tree, writable = world
    (tree / "probe.py").write_text(
        "import os, sys, json\n"
        "try:\n    seen = os.listdir(sys.argv[1] + '/runs')\nexcept OSError as e:\n    seen = str(e)\n"
        "print(json.dumps(seen))\n"
    )
    launch = confine([sys.executable, "-I", "/system/probe.py", str(home.root)], tree=tree, binds=[],
                     home=home, env={"PATH": "/usr/bin:/bin"}, cpus=None)  # fmt: skip
    try:
        proc = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    finally:
        launch.cleanup()
    seen = json.loads(proc.stdout)
    assert "secret.jsonl" not in seen


def test_a_file_past_the_size_limit_ends_the_system(world):
    home, tree, _ = world
    (tree / "probe.py").write_text(
        f"f = open('/tmp/big', 'wb')\nf.write(b'x' * ({FSIZE} + 4096))\nf.flush()\nprint('wrote')\n"
    )
    launch = confine([sys.executable, "-I", "/system/probe.py"], tree=tree, binds=[], home=home,
                     env={"PATH": "/usr/bin:/bin"}, cpus=None)  # fmt: skip
    try:
        proc = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    finally:
        launch.cleanup()
    assert "wrote" not in proc.stdout and proc.returncode != 0


@pytest.mark.skipif(not CGROUPS, reason="no writable cgroup hierarchy with cpuset here")
def test_the_cpuset_holds_and_the_freezer_stops_everything(world):
    home, tree, writable = world
    got = run_probe(home, tree, writable, cpus={0})
    assert got["affinity"] == [0] and got["affinity_after"] == [0], "a cpuset cannot be widened from inside"
    # The launcher's handles on the cgroups stay with it: the namespace's init holds none to reach.
    assert not any("cgroup" in link or "freezer" in link for link in got.get("init_fds", [])), got["init_fds"]
    cg = Cgroup.create({0})
    assert cg is not None
    spin = subprocess.Popen(
        [sys.executable, "-c", "import threading\nfor _ in range(2): threading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()"],
        preexec_fn=lambda: [Path(f).write_text(str(os.getpid())) for f in cg.procs],
    )  # fmt: skip
    try:
        time.sleep(0.5)
        cg.freeze(True)
        t0 = cg.cpu_seconds()
        time.sleep(0.5)
        frozen = cg.cpu_seconds() - t0
        cg.freeze(False)
        time.sleep(0.5)
        assert (
            frozen < 0.02 and cg.cpu_seconds() - t0 > 0.1
        )  # a thawed spinner runs again (machine may be busy)
        assert set(cg.pids()) >= {spin.pid}
    finally:
        cg.remove()
        spin.wait(timeout=10)
    assert not Path(cg.procs[0]).exists()


CONTROLLER = r"""
import json, subprocess, sys, time
from pathlib import Path
from specpilot.controller.confine import confine
from specpilot.deployments import Home
launch = confine([sys.executable, "-I", "-c", "print('up', flush=True)\nimport time\nwhile True: time.sleep(1)"],
                 tree=Path(sys.argv[1]), binds=[], home=Home(Path(sys.argv[2])), env={"PATH": "/usr/bin:/bin"},
                 cpus={0})
proc = subprocess.Popen(launch.argv, env=launch.env, stdout=subprocess.PIPE, text=True, start_new_session=True)
assert proc.stdout.readline().strip() == "up"
launch.cgroup.freeze(True)
print(json.dumps({"pids": launch.cgroup.pids(), "launcher": proc.pid, "freezer": str(launch.cgroup.dirs["freezer"])}),
      flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not CGROUPS, reason="no writable cgroup hierarchy with cpuset here")
def test_a_frozen_system_dies_with_its_controller(world):
    """The controller is killed while the system sits frozen in its turn: the launcher (outside the
    cgroup, never frozen) thaws it and kills it, so nothing of it is left running or frozen."""
    home, tree, _ = world
    ctl = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(tree), str(home.root)], stdout=subprocess.PIPE,
                           text=True)  # fmt: skip
    got = json.loads(ctl.stdout.readline())
    assert got["pids"] and got["launcher"] not in got["pids"], "the launcher stays outside the cgroup"
    assert all(proc_state(p) in ("T", "D", "S") for p in got["pids"])
    left = left_behind(ctl, [*got["pids"], got["launcher"]])
    assert not left, f"left behind: {left}"
    procs = Path(got["freezer"]) / "cgroup.procs"
    assert not procs.exists() or not procs.read_text().split()
    for d in Path("/sys/fs/cgroup").glob(f"*/{Path(got['freezer']).name}"):
        d.rmdir()


UNGROUPED_CONTROLLER = r"""
import json, subprocess, sys, time
from pathlib import Path
import psutil
from specpilot.controller import confine as confine_mod
from specpilot.deployments import Home
confine_mod.Cgroup.create = staticmethod(lambda cpus: None)  # as on a machine without a writable cgroup
launch = confine_mod.confine([sys.executable, "-I", "-c", "print('up', flush=True)\nwhile True: pass"],
                             tree=Path(sys.argv[1]), binds=[], home=Home(Path(sys.argv[2])), env={"PATH": "/usr/bin:/bin"},
                             cpus=None, cgroups="optional")
proc = subprocess.Popen(launch.argv, env=launch.env, stdout=subprocess.PIPE, text=True, start_new_session=True)
assert proc.stdout.readline().strip() == "up"
below = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
print(json.dumps({"pids": below, "launcher": proc.pid}), flush=True)
time.sleep(600)
"""


def test_without_a_cgroup_a_running_system_dies_with_its_controller(world):
    """Killed mid-round on a machine without a writable cgroup (the lent GPU's), the controller takes
    the whole confined tree with it: the launcher, the namespace's first process (whose death signal
    the switch to the run's own user had cleared, leaving a GPU server serving on into the next
    round's measurements) and the system."""
    home, tree, _ = world
    ctl = subprocess.Popen([sys.executable, "-c", UNGROUPED_CONTROLLER, str(tree), str(home.root)],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    got = json.loads(ctl.stdout.readline())
    assert len(got["pids"]) == 2, "the namespace's first process and the system"
    left = left_behind(ctl, [*got["pids"], got["launcher"]])
    assert not left, f"left behind: {left}"


# A machine without a writable cgroup, made for real: a mount namespace of its own in which every
# cgroup mount is read-only (so on the lent H200, where /sys/fs/cgroup is not writable).
READ_ONLY_CGROUPS = (
    "awk '$3 ~ /^cgroup/ {print $2}' /proc/self/mounts | while read -r m; do mount -o remount,bind,ro \"$m\" || exit 9; "
    'done; exec "$0" "$@"'
)
NO_CGROUP_RUN = r"""
import json, subprocess, sys
from pathlib import Path
from specpilot.controller.confine import confine
from specpilot.deployments import Home, SpecPilotError
tree, home, mode = Path(sys.argv[1]), Home(Path(sys.argv[2])), sys.argv[3]
try:
    launch = confine([sys.executable, "-I", "-c", "print(open('/proc/self/uid_map').read().split()[1])"],
                     tree=tree, binds=[], home=home,
                     env={"PATH": "/usr/bin:/bin"}, cpus={0}, cgroups=mode)
except SpecPilotError as e:
    print(json.dumps({"refused": str(e)}))
    sys.exit(0)
try:
    run = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=60)
    print(json.dumps({"cgroup": launch.cgroup is not None, "rc": run.returncode, "out": run.stdout.strip()}))
finally:
    launch.cleanup()
"""


def _without_cgroups(world, tmp_path: Path, mode: str) -> dict:
    home, tree, _ = world
    jails = tmp_path / "jails"
    jails.mkdir()
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", READ_ONLY_CGROUPS, sys.executable, "-c", NO_CGROUP_RUN,
                           str(tree), str(home.root), mode], env=os.environ | {"TMPDIR": str(jails)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not list(jails.iterdir()), "nothing of the launch is left behind"
    return json.loads(proc.stdout)


needs_mounts = pytest.mark.skipif(
    os.geteuid() != 0 or not CGROUPS, reason="needs root (a mount namespace) and a cgroup hierarchy to hide"
)


@needs_mounts
def test_no_cgroup_refuses_in_one_line_naming_the_fix(world, tmp_path):
    got = _without_cgroups(world, tmp_path, "required")
    assert "\n" not in got["refused"]
    assert got["refused"].startswith("no cgroup can be made here")
    assert (
        "/sys/fs/cgroup is writable" in got["refused"] and 'controller.cgroups = "optional"' in got["refused"]
    )


@needs_mounts
def test_a_deployment_that_opts_out_runs_confined_without_a_cgroup(world, tmp_path):
    got = _without_cgroups(world, tmp_path, "optional")
    assert got == {"cgroup": False, "rc": 0, "out": got["out"]}
    assert RUN_UIDS[0] <= int(got["out"]) < RUN_UIDS[1], (
        "still a user of its own, in a user namespace of its own"
    )


ESCAPE = r"""
import os, sys, time
if os.fork() == 0:  # a helper that leaves the process group (and the session) and computes on
    os.setsid()
    while True:
        pass
print('{"ready": true}', flush=True)
time.sleep(60)
"""


def test_without_a_cgroup_a_process_that_left_the_group_is_frozen_too(world, tmp_path, monkeypatch):
    """Where no cgroup is made (controller.cgroups = "optional"), a pause signals every process below
    the launcher: a helper that called setsid() is out of the process group, not out of reach."""
    import psutil

    from specpilot.controller import confine as confine_mod
    from specpilot.controller.engine import LineProcess, process_tree

    home, tree, _ = world
    (tree / "escape.py").write_text(ESCAPE)
    monkeypatch.setattr(confine_mod.Cgroup, "create", staticmethod(lambda cpus: None))
    launch = confine([sys.executable, "-I", "/system/escape.py"], tree=tree, binds=[], home=home,
                     env={"PATH": "/usr/bin:/bin"}, cpus=None, cgroups="optional")  # fmt: skip
    proc = LineProcess(launch, cwd=tree, log=tmp_path / "escape.log", cpus=None)
    try:
        proc.next_event(time.perf_counter() + 60, "loading")

        def cpu() -> float:
            return sum(sum(psutil.Process(p).cpu_times()[:2]) for p in process_tree(proc.proc.pid))

        proc.pause(True)
        time.sleep(0.2)  # let the stop land
        before = cpu()
        time.sleep(1.0)
        assert cpu() - before < 0.05, "a process of the paused system went on computing"
        proc.pause(False)
        before = cpu()
        time.sleep(0.5)
        assert cpu() - before > 0.2, "the helper runs again once the system is thawed"
    finally:
        proc.stop(grace_s=1)
