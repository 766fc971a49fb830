"""`specpilot seal-check`: recompute every reproduction and report each one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

import specpilot.memory_store as ms

from .output import Ctx, emit


def _render_results(con: Console, results: list[ms.SealResult]) -> None:
    if not results:
        con.print("nothing to check: no entries or sealed systems")
        return
    table = Table(title="Seal check")
    for col in ("", "kind", "name", "sealed tree", "rebuilt", "detail"):
        table.add_column(col)
    for r in results:
        mark = "[green]ok[/]" if r.ok else "[bold red]FAIL[/]"
        table.add_row(mark, r.kind, r.name, r.tree[:12], (r.rebuilt or "-")[:12], r.detail)
    con.print(table)
    bad = sum(not r.ok for r in results)
    con.print(
        f"[bold red]{bad} of {len(results)} failed[/]" if bad else f"all {len(results)} reproduce exactly"
    )


def seal_check(
    ctx: typer.Context,
    entry: list[str] = typer.Option([], "--entry", help="Check this entry (repeatable)."),
    system: list[str] = typer.Option(
        [], "--system", help="Check this sealed system: tree hash or deployment."
    ),
    all_: bool = typer.Option(False, "--all", help="Every entry and sealed system (the default)."),
    bundle: list[Path] = typer.Option([], "--bundle", help="Check a bundle folder on its own (repeatable)."),
    builtin: bool = typer.Option(False, "--builtin", help="Check SpecPilot's built-in bundles."),
) -> None:
    """Recompute every reproduction (entries, sealed systems, bundles); exit 1 when any differs."""
    c: Ctx = ctx.obj
    bundles = list(bundle) + (list(ms.builtin_bundles().values()) if builtin else [])
    results: list[ms.SealResult] = []
    if entry or system or all_ or not (bundle or builtin):
        memory = ms.open_memory(c.home)
        systems = [s for ref in system for s in ms.find_systems(memory.db, ref)]
        if all_ or not (entry or system):
            results += ms.seal_check(memory)
        else:
            results += ms.seal_check(memory, entries=entry, systems=systems)
    for b in bundles:
        results += ms.check_bundle(b, lambda engine: ms.engine_stocks(engine, c.home))
    emit(c, [r.as_dict() for r in results], lambda con: _render_results(con, results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)
