"""The controller guards its own integrity: it refuses to judge once anything that decides or
records a verdict has changed.

The digest covers the installed controller package, the deployment spec's rules (its defaults and
the paired design it picks), the memory store's record, tree-hash and workspace code (verdicts and
runs are written there; systems are named by tree hash and exported from the workspace), the
pristine refspec stock tree (the token-forcing scorer is its target) and
the scorer's weights. It is recorded when a deployment's Phase 0 runs and checked before every run,
so a patch that edits the judge — by an agent or by accident — stops all judging until a person
reruns Phase 0.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from specpilot.deployments import SpecPilotError

CONTROLLER_DIR = Path(__file__).resolve().parent
PACKAGE = CONTROLLER_DIR.parent
JUDGE = [
    CONTROLLER_DIR,
    PACKAGE / "deployments" / "spec.py",
    PACKAGE / "deployments" / "workloads",  # renders the judged prompts (their tags)
    PACKAGE / "memory_store" / "records.py",
    PACKAGE / "memory_store" / "models.py",
    PACKAGE / "memory_store" / "db.py",
    PACKAGE / "memory_store" / "gittree.py",
    PACKAGE / "memory_store" / "workspace.py",
    PACKAGE / "deployments" / "stock" / "refspec",
]


def _files() -> list[Path]:
    out = []
    for root in JUDGE:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        out += [p for p in paths if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return out


def _weights_id(folder: Path, cache: Path) -> str:
    """sha256 of the scorer's weight files, cached by (path, size, mtime) so a judgement pays once."""
    out = []
    for f in sorted(folder.glob("*")):
        if not f.is_file():
            continue
        st = f.stat()
        key = hashlib.sha256(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
        memo = cache / key
        if memo.is_file():
            out.append(memo.read_text())
            continue
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        digest = f"{f.name}:{h.hexdigest()}"
        cache.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}")
        tmp.write_text(digest)
        os.replace(tmp, memo)
        out.append(digest)
    return json.dumps(out)


def controller_digest(weights: Path | None = None, cache: Path | None = None) -> str:
    """sha256 over (path, bytes) of every file that decides or records a verdict, and the weights."""
    h = hashlib.sha256()
    for path in _files():
        h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    if weights is not None and weights.is_dir():
        h.update(_weights_id(weights, cache or weights / ".digest").encode())
    return h.hexdigest()


def check_digest(recorded: str | None, deployment: str, now: str) -> str:
    """The current digest `now`, after checking it against the one recorded at Phase 0."""
    if recorded is not None and recorded != now:
        raise SpecPilotError(
            f"the judge changed since Phase 0 of {deployment!r} (digest {recorded[:16]} then, {now[:16]} now: "
            f"controller, verdict records, tree hashing, the stock scorer or its weights): it refuses to judge; "
            f"if the change is yours and intended, rerun `specpilot phase0 --deployment {deployment}`"
        )
    return now
