"""`specpilot workspace init|status`."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from specpilot.deployments import load_deployment
from specpilot.memory_store import STOCK_TAG, SYSTEM_BRANCH, Workspace

from .output import Ctx, emit

app = typer.Typer(
    help="Per-deployment git workspaces: the stock tree, the current system, candidates.",
    no_args_is_help=True,
)


@app.command()
def init(
    ctx: typer.Context, deployment: str = typer.Option(..., "--deployment", "-d", help="Deployment name.")
) -> None:
    """Create the deployment's workspace with its stock commit (idempotent)."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    ws, created = Workspace.init(c.home, dep)
    data = {
        "deployment": dep.name,
        "path": str(ws.root),
        "created": created,
        "stock_tree": ws.stock_tree,
        "system_tree": ws.system_tree,
    }

    def render(con: Console) -> None:
        verb = "created" if created else "already initialized"
        con.print(f"workspace [bold]{dep.name}[/] {verb} at {ws.root}")
        con.print(f"  stock tree  {ws.stock_tree}")
        con.print(f"  system tree {ws.system_tree}")

    emit(c, data, render)


def _describe(ws: Workspace) -> dict:
    branches = [b for b in ws.branches() if b != SYSTEM_BRANCH]
    return {
        "deployment": ws.name,
        "path": str(ws.root),
        "stock_tree": ws.stock_tree,
        "system_tree": ws.system_tree,
        "system_is_stock": ws.system_tree == ws.stock_tree,
        "system_commit": ws.commit(SYSTEM_BRANCH),
        "system_subject": ws.subject(SYSTEM_BRANCH),
        "stock_commit": ws.commit(STOCK_TAG),
        "candidates": branches,
        "worktrees": [str(p) for p in ws.worktrees()],
    }


@app.command()
def status(ctx: typer.Context) -> None:
    """Every workspace under the home: stock and system tree hashes, candidates, worktrees."""
    c: Ctx = ctx.obj
    roots = (
        sorted(p for p in c.home.workspaces.glob("*") if Workspace.exists(c.home, p.name))
        if c.home.workspaces.is_dir()
        else []
    )
    rows = [_describe(Workspace(p)) for p in roots]

    def render(con: Console) -> None:
        if not rows:
            con.print(
                f"no workspaces under {c.home.workspaces}; create one with `specpilot workspace init --deployment smollm-cpu`"
            )
            return
        table = Table(title=f"Workspaces in {c.home.root}")
        for col in ("deployment", "stock tree", "system tree", "system", "candidates", "worktrees"):
            table.add_column(col)
        for r in rows:
            system = "stock" if r["system_is_stock"] else r["system_subject"]
            table.add_row(
                r["deployment"],
                r["stock_tree"][:12],
                r["system_tree"][:12],
                system,
                str(len(r["candidates"])),
                str(len(r["worktrees"])),
            )
        con.print(table)

    emit(c, rows, render)
