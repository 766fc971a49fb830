"""Where SpecPilot keeps its state (ARCHITECTURE §3).

`SPECPILOT_HOME` (default `./.specpilot`, like `.git`) holds the database, workspaces, runs,
transcripts and the cache. `SPECPILOT_CACHE` may point the cache elsewhere so several homes
(test homes, worktrees) share converted weights and downloaded workload files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def resolve(cls, root: str | Path | None = None) -> Home:
        """The home named explicitly, else by SPECPILOT_HOME, else ./.specpilot."""
        chosen = root if root is not None else os.environ.get("SPECPILOT_HOME", ".specpilot")
        return cls(Path(chosen).expanduser().resolve())

    @property
    def cache(self) -> Path:
        env = os.environ.get("SPECPILOT_CACHE")
        return Path(env).expanduser().resolve() if env else self.root / "cache"

    @property
    def workspaces(self) -> Path:
        return self.root / "workspaces"

    def round_dir(self, deployment: str, number: int) -> Path:
        """Where a round's pictures are written (its state lives in the database)."""
        return self.root / "rounds" / deployment / f"round-{number}"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def records(self) -> list[Path]:
        """What the controller keeps of judged runs: the SQLite database and its journals, raw runs
        and round reports, of this home and of every home of its cluster (the head's and each node's,
        `nodes/<id>`; not their workspaces). They hold each draw's secret tags and the answers given
        under them, so no agent may read them (agents/claude/session.py)."""
        head = self.root.parent.parent if self.root.parent.name == "nodes" else self.root
        homes = [head, *sorted(p for p in (head / "nodes").glob("*") if p.is_dir())]
        out = []
        for root in homes:
            db = root / "specpilot.db"
            out += [
                db,
                *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal")),
                root / "runs",
                root / "rounds",
            ]
        return out

    @property
    def transcripts(self) -> Path:
        return self.root / "transcripts"

    @property
    def deployments(self) -> Path:
        """User deployment specs; a file here shadows a shipped spec of the same name."""
        return self.root / "deployments"

    @property
    def db_url(self) -> str:
        """SPECPILOT_DB_URL (e.g. a PostgreSQL URL shared by a team), else SQLite in the home."""
        return os.environ.get("SPECPILOT_DB_URL") or f"sqlite:///{self.root / 'specpilot.db'}"
