"""Starting a refspec system: its serve module from its export, confined (confine.py), run from
the module's verified bytes (serve_boot.py).

The same command line, paths and environment in every run the controller makes (Phase 0,
compare, noise, audit, an agent's quick measure), so nothing a system can see tells one from
another. Before a tree's first timed period it gets one untimed *prepare* run on decoy weights
(random values, the real shapes and config) with its compile cache writable, so Triton kernels and
the like compile once; timed runs read that cache and never write it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.deployments.stock import import_refspec

from .confine import CACHE, SYSTEM, confine, hand_to, take_back
from .engine import JsonLinesSystem, LineProcess
from .serve_boot import boot_command
from .slots import Slot

PREPARED = ".prepared"  # marker the controller writes into a compile cache once its prepare run passed


def weights_folder(dep: Deployment, home: Home) -> Path:
    """The target's HF folder on this machine (SmolLM2 is converted from its GGUF on first use)."""
    import_refspec()
    from refspec.errors import RefspecError
    from refspec.weights import resolve_model

    try:
        return resolve_model(dep.target.model, home.cache)
    except RefspecError as e:
        raise SpecPilotError(f"deployment {dep.name!r}: the target's weights: {e}") from None


# What a decoy takes from the real folder besides its shapes: configuration and tokenizer files by
# name, none large. Anything else — a weight file of any format, under any name — stays out.
DECOY_KEEPS = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model",
               "chat_template.jinja", "chat_template.json"}  # fmt: skip
DECOY_MAX_FILE = 32 << 20
DECOY_VERSION = "2"  # a decoy made by an earlier rule is made again


def decoy_folder(real: Path, home: Home) -> Path:
    """Random weights with the real folder's tensor names, shapes and dtypes, and its config and
    tokenizer files (`DECOY_KEEPS`); made once. Nothing else of the real folder is in it."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = home.cache / "decoys" / real.name
    if (out / "DECOY").is_file() and (out / "DECOY").read_text() == DECOY_VERSION:
        return out
    try:
        config = json.loads((real / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        config = {}
    draw = config.get("synthetic") if isinstance(config, dict) else None
    if isinstance(draw, dict):  # weights drawn at load (refspec/synthetic.py): the decoy draws another seed
        config["synthetic"] = draw | {"seed": draw.get("seed", 0) + 1}
        text = json.dumps(config, indent=1)
        return _write_decoy(real, out, lambda tmp: (tmp / "config.json").write_text(text))
    shards = sorted(real.glob("*.safetensors"))
    if not shards:
        raise SpecPilotError(f"{real}: no .safetensors weights, so no decoy of their shapes can be made for the "
                             "untimed prepare run; convert the model folder to safetensors")  # fmt: skip

    def weights(tmp: Path) -> None:
        gen = torch.Generator().manual_seed(0)
        tensors = {}
        for f in shards:
            with safe_open(str(f), "pt") as st:
                for name in st.keys():  # noqa: SIM118 — safe_open has no __iter__
                    t = st.get_slice(name)
                    shape, dtype = t.get_shape(), getattr(torch, {"F32": "float32", "BF16": "bfloat16",
                                                                  "F16": "float16"}.get(t.get_dtype(), "float32"))  # fmt: skip
                    tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"decoy": "random values"})

    return _write_decoy(real, out, weights)


def _write_decoy(real: Path, out: Path, weights) -> Path:
    """The decoy folder: `weights(tmp)` writes its weights (or config), then the kept files of `real`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".decoy-"))
    try:
        weights(tmp)
        for f in real.iterdir():
            if (
                f.name in DECOY_KEEPS
                and f.is_file()
                and not f.is_symlink()
                and f.stat().st_size <= DECOY_MAX_FILE
                and not (tmp / f.name).exists()
            ):
                shutil.copy2(f, tmp / f.name)
        (tmp / "DECOY").write_text(DECOY_VERSION)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def compile_cache(home: Home, tree: str, slot: Slot) -> Path:
    return home.cache / "compile" / f"{tree}-{slot.kind}"


def system_env(slot: Slot) -> dict[str, str]:
    """The environment of a system's process inside its jail: its tree alone on the path, one
    thread, the compile caches under /cache/compile, its slot's GPU."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONPATH": SYSTEM,
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "TRITON_CACHE_DIR": f"{CACHE}/compile/triton", "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/compile/inductor",
        "CUDA_CACHE_PATH": f"{CACHE}/compile/nv", **slot.env(),
    }  # fmt: skip
    for var in ("LD_LIBRARY_PATH", "CUDA_HOME"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


def _model_inside(dep: Deployment, real: Path) -> tuple[str, str]:
    """(where the weights are inside a jail, the --model argument that names them there)."""
    inside = f"{CACHE}/models/{real.name}"
    by_name = real.parent.name == "models" and real.name == dep.target.model
    return inside, (dep.target.model if by_name else inside)


@dataclass
class _ToolLaunch:
    launch: object
    scratch: Path

    @property
    def argv(self) -> list[str]:
        return self.launch.argv

    @property
    def env(self) -> dict[str, str]:
        return self.launch.env

    def cleanup(self) -> None:
        self.launch.cleanup()
        shutil.rmtree(self.scratch, ignore_errors=True)


def tool_jail(dep: Deployment, home: Home):
    """The jail the cost model's tools run in (costmodel.runner.Jail): a system's profiler and
    recorder are its own code, confined as its serve process is, with the target's real weights
    read-only, a compile cache of the run's own (thrown away after) and `SPECPILOT_CACHE` at /cache."""

    def jail(cmd: list[str], tree: Path, binds: list[tuple[Path, str, str]], slot: str) -> _ToolLaunch:
        s = Slot.parse(slot)
        real = weights_folder(dep, home)
        inside, model = _model_inside(dep, real)
        cmd = [model if i and cmd[i - 1] == "--model" else a for i, a in enumerate(cmd)]
        scratch = Path(tempfile.mkdtemp(prefix="specpilot-tool-cc-"))
        env = system_env(s) | {"SPECPILOT_CACHE": CACHE}
        all_binds = [(real, inside, "ro"), (scratch, f"{CACHE}/compile", "rw"), *binds]
        try:
            launch = confine(cmd, tree=tree, binds=all_binds, home=home, env=env, cpus=s.host_cores(),
                             cgroups=dep.controller.cgroups)  # fmt: skip
            hand_to(scratch, launch)
            for src, _, mode in binds:
                if mode == "rw":
                    hand_to(src, launch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return _ToolLaunch(launch, scratch)

    return jail


@dataclass(frozen=True)
class RefspecAdapter:
    """A system's serve module (serve_boot.py) from its export, confined, the tree alone on the path."""

    dep: Deployment
    home: Home

    def start(self, tree: str, path: Path, slot: Slot, log: Path, role: str = "A", prepare: bool = False):
        real = weights_folder(self.dep, self.home)
        weights = decoy_folder(real, self.home) if prepare else real
        inside, model = _model_inside(self.dep, real)
        cc = compile_cache(self.home, tree, slot)
        cc.mkdir(parents=True, exist_ok=True)
        cmd = boot_command(sys.executable, path, SYSTEM) + ["--device", slot.device_arg(), "--model", model,
               "--cache", CACHE] + (["--batch"] if self.dep.serving.shape == "batch" else [])  # fmt: skip
        env = system_env(slot)
        binds = [(weights, inside, "ro"), (cc, f"{CACHE}/compile", "rw" if prepare else "ro")]
        cpus = slot.host_cores()
        launch = confine(cmd, tree=path, binds=binds, home=self.home, env=env, cpus=cpus,
                         cgroups=self.dep.controller.cgroups)  # fmt: skip
        if prepare:
            hand_to(cc, launch)
        return JsonLinesSystem(LineProcess(launch, cwd=path, log=log, cpus=cpus))

    def prepare(self, tree: str, path: Path, slot: Slot, log: Path, role: str) -> float | None:
        """One untimed run on decoy weights that fills the tree's compile cache (once per tree and
        device kind); the seconds it took to be ready, or None when the cache was ready already."""
        cc = compile_cache(self.home, tree, slot)
        if (cc / PREPARED).is_file():
            return None
        system = self.start(tree, path, slot, log, role, prepare=True)
        try:
            ready = system.wait_ready()
        finally:
            system.stop()
        take_back(cc)
        (cc / PREPARED).write_text(json.dumps({"ready_s": ready.get("_ready_s")}))
        return ready.get("_ready_s")
