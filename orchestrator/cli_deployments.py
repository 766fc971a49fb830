"""`specpilot deployments list|show`."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from specpilot.deployments import Deployment, deployment_files, load_deployment

from .output import Ctx, emit

app = typer.Typer(
    help="The deployments SpecPilot knows: shipped specs and yours under <home>/deployments/.",
    no_args_is_help=True,
)


def _serving(dep: Deployment) -> str:
    if dep.serving.shape == "single":
        return "single request"
    return "batch " + "/".join(map(str, dep.serving.batch_sizes))


@app.command("list")
def list_(ctx: typer.Context) -> None:
    """All deployments, one line each."""
    c: Ctx = ctx.obj
    deps = [load_deployment(name, c.home) for name in deployment_files(c.home)]
    rows = [
        {
            "name": d.name,
            "engine": d.engine,
            "target": d.target.model,
            "dtype": d.target.dtype,
            "drafter": d.drafter.kind,
            "device": d.devices.kind,
            "slots": d.devices.slots,
            "serving": _serving(d),
        }
        for d in deps
    ]

    def render(con: Console) -> None:
        table = Table(title="Deployments")
        for col in ("name", "engine", "target", "dtype", "drafter", "device", "serving"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                *(str(r[k]) for k in ("name", "engine", "target", "dtype", "drafter", "device", "serving"))
            )
        con.print(table)

    emit(c, rows, render)


@app.command()
def show(
    ctx: typer.Context, name: str = typer.Argument(help="Deployment name or path to a .toml file.")
) -> None:
    """One deployment in full."""
    c: Ctx = ctx.obj
    dep = load_deployment(name, c.home)

    def render(con: Console) -> None:
        tree = Tree(f"[bold]{dep.name}[/] — {dep.description}")
        stock = f"built-in tree {dep.stock.tree!r}" if dep.stock.tree else f"wheel {dep.stock.wheel}"
        tree.add(f"engine [cyan]{dep.engine}[/], stock {stock}")
        a = dep.target.arch
        shape = f"{a.layers} layers ({a.gdn_layers} Gated DeltaNet)" if a.gdn_layers else f"{a.layers} layers"
        tree.add(
            f"target [cyan]{dep.target.model}[/] {dep.target.dtype}: {shape}, hidden {a.hidden}, "
            f"{a.heads}/{a.kv_heads} heads x {a.head_dim}, MLP {a.intermediate}, vocab {a.vocab:,}"
        )
        d = dep.drafter
        tree.add(
            f"drafter [cyan]{d.kind}[/]{f' {d.model}' if d.model else ''}: block {d.block_size}, top-{d.top_k}"
        )
        tree.add(f"devices {dep.devices.kind}: {', '.join(dep.devices.slots)}; serving {_serving(dep)}")
        w = dep.workload
        sets = ", ".join(f"{k} x{v}" for k, v in w.sets.items())
        tree.add(
            f"workload {sets}; {w.max_new_tokens} new tokens, seed {w.seed}, thinking {'on' if w.thinking else 'off'}"
        )
        k = dep.controller
        tree.add(
            f"approval: lower bound > {k.min_gain:.0%} + 2σ ({k.output_change_gain:.0%} if output changes); "
            f"{k.blocks} blocks; protected {', '.join(k.protected) or '(none)'}"
        )
        if dep.engine_flags:
            tree.add("engine flags: " + " ".join(f"--{f} {v}" for f, v in dep.engine_flags.items()))
        con.print(tree)

    emit(c, dep.model_dump(mode="json"), render)
