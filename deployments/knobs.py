"""Editing one knob of a TOML knobs file in place, keeping its comments and layout.

A retune must be a one-line diff, so the patch a memory entry or a round stores says exactly what
changed; re-serializing the whole file would rewrite every line.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from .errors import SpecPilotError

_SECTION = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")


def _literal(value: int | float | str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string
    return repr(value)


def set_knob(path: Path, knob: str, value: int | float | str | bool) -> None:
    """Set `section.key = value` in the TOML file at `path`, touching only that line."""
    section, key = knob.split(".", 1)
    lines = path.read_text().splitlines(keepends=True)
    current, insert_at, done = None, None, False
    key_re = re.compile(rf"^(\s*{re.escape(key)}\s*=\s*)([^#\n]*?)(\s*(#.*)?)$")
    for i, line in enumerate(lines):
        m = _SECTION.match(line)
        if m:
            if current == section and insert_at is None:
                insert_at = i
            current = m.group(1).strip()
            continue
        if current == section:
            km = key_re.match(line.rstrip("\n"))
            if km:
                lines[i] = km.group(1) + _literal(value) + km.group(3) + "\n"
                done = True
                break
    if not done:
        if current == section and insert_at is None:
            insert_at = len(lines)
        if insert_at is None:
            raise SpecPilotError(f"{path}: no [{section}] section to hold knob {knob!r}")
        while insert_at > 0 and not lines[insert_at - 1].strip():
            insert_at -= 1
        lines.insert(insert_at, f"{key} = {_literal(value)}\n")
    text = "".join(lines)
    parsed = tomllib.loads(text)
    if parsed.get(section, {}).get(key) != value:
        raise SpecPilotError(f"{path}: setting {knob} = {value!r} did not round-trip through TOML")
    path.write_text(text)


def get_knob(path: Path, knob: str) -> object:
    section, key = knob.split(".", 1)
    return tomllib.loads(path.read_text()).get(section, {}).get(key)
