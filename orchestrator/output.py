"""Terminal output: rich for people, `--json` for machines, from the same data."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from specpilot.deployments import Home

console = Console()
err_console = Console(stderr=True)


@dataclass(frozen=True)
class Ctx:
    """What the global options decided; every command receives it through typer's context."""

    home: Home
    json: bool


def emit(ctx: Ctx, data: Any, render: Callable[[Console], None]) -> None:
    """Print `data` as JSON under --json, else let `render` draw it."""
    if ctx.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        render(console)
