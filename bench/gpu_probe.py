"""What a GPU machine lets the controller do: confinement, cgroups, NVML, a confined CUDA system.

    python bench/gpu_probe.py --model FOLDER [--json OUT]     (after `source bench/gpu_env.sh`)

Prints and records: the cgroup layout and whether a cpuset/freezer cgroup can be made; whether a
system can be confined (jail.py) and still use the GPU; NVML samples of the idle GPU; and a real
refspec system started the controller's way (prepare run on decoy weights, then a timed start),
its time to ready and one request's output.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="an HF folder (random weights are fine)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict = {}
    from specpilot.controller.cgroups import Cgroup, _mounts
    from specpilot.controller.confine import check_available, confine
    from specpilot.controller.gpu_load import GpuWatch
    from specpilot.deployments import Home, load_deployment

    out["cgroup_mounts"] = {k: str(v) for k, v in _mounts().items()}
    cg = Cgroup.create({0})
    out["cgroup"] = (
        None if cg is None else {"version": cg.version, "dirs": {k: str(v) for k, v in cg.dirs.items()}}
    )
    if cg is not None:
        cg.remove()
    check_available()
    home = Home(Path("/root/sp/probe-home"))
    tree = Path(__file__).resolve().parents[1] / "deployments" / "stock" / "refspec"
    code = "import torch; x = torch.ones(1 << 20, device='cuda'); print(torch.cuda.get_device_name(0), float(x.sum()))"
    launch = confine([sys.executable, "-c", code], tree=tree, binds=[], home=home,
                     env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "0"}, cpus=None)  # fmt: skip
    t = time.perf_counter()
    try:
        proc = subprocess.run(launch.argv, env=launch.env, capture_output=True, text=True, timeout=300)
    finally:
        launch.cleanup()
    out["confined_cuda"] = {"rc": proc.returncode, "stdout": proc.stdout.strip(), "stderr": proc.stderr[-800:],
                            "s": time.perf_counter() - t}  # fmt: skip
    watch = GpuWatch(0)
    watch.start(set())
    time.sleep(1.0)
    out["nvml_idle"] = watch.stop().to_json()

    from specpilot.controller.refspec_system import RefspecAdapter
    from specpilot.controller.slots import Slot

    dep = load_deployment("smollm-h200")
    dep = dep.model_copy(
        update={"target": dep.target.model_copy(update={"model": str(Path(args.model).resolve())})}
    )
    adapter = RefspecAdapter(dep, home)
    slot = Slot("cuda", 0)
    logs = home.root / "probe-logs"
    from specpilot.controller.engine import Request, SystemFailed

    try:
        t = time.perf_counter()
        prep = adapter.prepare("stock-probe", tree, slot, logs / "prepare.log", "A")
        out["prepare"] = {"ready_s": prep, "wall_s": time.perf_counter() - t}
        system = adapter.start("stock-probe", tree, slot, logs / "timed.log", "A")
        try:
            ready = system.wait_ready()
            res = system.run(Request("r0", list(range(100, 160)) * 2, 64), timeout_s=120)
            usage = system.usage()
        finally:
            system.stop()
        out["timed"] = {"ready_s": ready.get("_ready_s"), "tokens": len(res.tokens), "seconds": res.seconds,
                        "ms_per_token": 1e3 * res.seconds / len(res.tokens), "usage": usage}  # fmt: skip
    except SystemFailed as e:
        out["system_failed"] = {"error": str(e), "log_tail": e.log_tail}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
