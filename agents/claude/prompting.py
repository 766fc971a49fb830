"""Prompt templates from `prompts/` (package data), rendered with Jinja."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import jinja2


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: resources.files("specpilot.prompts").joinpath(name).read_text()),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )  # fmt: skip


def render(name: str, **context: Any) -> str:
    """Render `prompts/<name>` with `context`; an unknown variable is an error, never an empty string."""
    return _env().get_template(name).render(**context)
