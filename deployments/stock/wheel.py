"""Stock trees of engines shipped as pinned wheels (SGLang): fetched once, unpacked byte for byte.

The stock tree of `sglang==0.5.20` is

    python/<every file of the wheel outside its *.dist-info/ and *.data/ folders>
    specpilot-launch.toml      the system's launch knobs (the one file that is not from the wheel)

so `PYTHONPATH=<tree>/python` imports the tree's own `sglang` package ahead of any installed one,
and paths read like SGLang's repository (`python/sglang/srt/...`). The dist-info is left out: it
only describes the installed copy and SGLang finds its version in `sglang/_version.py`. Compiled
extensions in the wheel (`*.so`) are part of the tree, so the wheel pip picks for this interpreter
(`--only-binary=:all:`) fixes the tree; the shipped pin is a cp311 manylinux wheel.

The wheel is fetched with `pip download --no-deps` into `<cache>/downloads/` and never installed;
once there, materializing needs no network. A tree is unpacked into a temporary folder and renamed
into place, so a failure leaves nothing behind and a concurrent materialization loses cleanly.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from ..errors import SpecPilotError
from ..pipwheel import pip_download_wheel

LAUNCH_FILE = "specpilot-launch.toml"
# The launch knobs of a stock SGLang system: speculative decoding as the deployment specifies it and
# no extra server flags. A memory entry retunes a flag by patching one line under [server].
LAUNCH_TEMPLATE = """\
# How SpecPilot launches this system (read by SpecPilot's sglang adapter, never by SGLang).
# The deployment spec gives the model, drafter and flags; this file retunes them per system.

[decode]
mode = "spec"  # "spec": the deployment's speculative decoding | "ar": the target alone (Phase 0's AR)

[server]
# Extra `python -m sglang.launch_server` flags over the deployment's: flag = value, true for a
# bare switch, false to drop a flag the deployment sets. Example: attention-backend = "triton"
"""
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def parse_pin(requirement: str) -> tuple[str, str]:
    """`sglang==0.5.20` -> ("sglang", "0.5.20"); anything but one pinned version is refused."""
    m = _PIN.match(requirement.strip())
    if not m:
        raise SpecPilotError(
            f"stock wheel {requirement!r} must pin exactly one version, as NAME==VERSION (e.g. sglang==0.5.20)"
        )
    return m.group(1), m.group(2)


def _cached(downloads: Path, name: str, version: str) -> list[Path]:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    return sorted(
        p for p in downloads.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version.lower()}-")
    )


def fetch_pinned_wheel(requirement: str, downloads: Path) -> Path:
    """The wheel of `requirement` in `downloads`, fetched with `pip download --no-deps` on first use.

    One cached wheel of that version is used as is (offline); several (a cache shared by different
    interpreters) are chosen between by pip itself, offline; none is downloaded from the index.
    """
    name, version = parse_pin(requirement)
    found = _cached(downloads, name, version) if downloads.is_dir() else []
    if len(found) == 1:
        return found[0]
    offline = ("--no-index", "--find-links", str(downloads)) if found else ()
    return pip_download_wheel(requirement, downloads, what=f"the stock wheel {requirement}",
                              options=("--only-binary=:all:", *offline))  # fmt: skip


def _tree_name(member: str) -> PurePosixPath | None:
    """Where a wheel member goes under `python/`, or None for metadata (dist-info, data)."""
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts or "\\" in member:
        raise SpecPilotError(f"wheel member {member!r} escapes the tree; the wheel is not safe to unpack")
    top = path.parts[0] if path.parts else ""
    if top.endswith((".dist-info", ".data")):
        return None
    return path


def unpack_wheel(wheel: Path, folder: Path) -> int:
    """Write the wheel's importable files under `folder/python/` and the launch knobs; the file count.

    `folder` must not exist yet; the tree is built next to `folder`'s parent and renamed into place.
    """
    scratch = folder.parent.parent  # outside the engine's folder, so no listing sees a half tree
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=scratch, prefix=f".materialize-{folder.name}-"))
    count = 0
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    if info.is_dir():
                        continue
                    rel = _tree_name(info.filename)
                    if rel is None:
                        continue
                    out = tmp / "python" / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)  # zipfile checks each member's CRC as it reads
                    count += 1
        except (zipfile.BadZipFile, OSError) as e:
            raise SpecPilotError(
                f"{wheel}: not a readable wheel ({e}); delete it and fetch it again"
            ) from None
        if count == 0:
            raise SpecPilotError(f"{wheel}: the wheel holds no package files")
        (tmp / LAUNCH_FILE).write_text(LAUNCH_TEMPLATE)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():
                raise
            # Another process materialized the same tree first: keep theirs.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return count


def materialize_wheel_stock(requirement: str, folder: Path) -> None:
    """The memory store's materializer for wheel stocks (`register_wheel_stock`).

    `folder` is `<cache>/stock/<engine>/<label>` (`memory_store.stock.wheel_folder`); the wheel
    itself is kept in `<cache>/downloads/`.
    """
    cache = folder.parent.parent.parent
    unpack_wheel(fetch_pinned_wheel(requirement, cache / "downloads"), folder)
