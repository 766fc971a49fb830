"""Transcripts: every message of an agent run as one JSON line, written as it arrives, key scrubbed."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            "type": type(obj).__name__,
            **{f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return repr(obj)


class Transcript:
    """An append-only JSONL file; `secrets` never reach it (each occurrence is replaced)."""

    def __init__(self, path: Path, secrets: list[str]):
        self.path = path
        self.secrets = [s for s in secrets if s]
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("w", encoding="utf-8")

    def scrub(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, REDACTED)
        return text

    def write(self, kind: str, data: Any) -> None:
        """One line: {"t": unix time, "kind": ..., "data": ...}; flushed at once (a killed run keeps it)."""
        line = json.dumps(
            {"t": round(time.time(), 3), "kind": kind, "data": _plain(data)}, ensure_ascii=False
        )
        self._f.write(self.scrub(line) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read(path: Path) -> list[dict[str, Any]]:
    """The lines of a stored transcript."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
