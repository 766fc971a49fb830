"""The controller guards its own integrity: it refuses to judge once its source has changed.

The digest covers every source file of the installed controller package. It is recorded when a
deployment's Phase 0 runs (or the first noise measurement) and checked before every run, so a
patch that edits the judge — by an agent or by accident — stops all judging until a person reruns
Phase 0.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specpilot.deployments import SpecPilotError

CONTROLLER_DIR = Path(__file__).resolve().parent


def controller_digest() -> str:
    """sha256 over (relative path, bytes) of every controller source file, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(CONTROLLER_DIR.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(CONTROLLER_DIR).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def check_digest(recorded: str | None, deployment: str) -> str:
    """The current digest, after checking it against the one recorded at Phase 0."""
    now = controller_digest()
    if recorded is not None and recorded != now:
        raise SpecPilotError(
            f"the controller's source changed since Phase 0 of {deployment!r} (digest {recorded[:12]} then, "
            f"{now[:12]} now): it refuses to judge; if the change is yours and intended, rerun "
            f"`specpilot phase0 --deployment {deployment}`"
        )
    return now
