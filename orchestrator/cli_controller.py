"""`specpilot phase0`, `specpilot controller noise|compare|audit`, `specpilot report`."""

from __future__ import annotations

from contextlib import contextmanager

import typer
from rich.console import Console
from rich.table import Table

from specpilot.deployments import SpecPilotError, load_deployment
from specpilot.memory_store import connect, records

from .output import Ctx, console, emit
from .reports import print_verdict, verdict_json, verdict_list

app = typer.Typer(
    help="The controller: stock noise, paired comparisons, token-forcing audits.", no_args_is_help=True
)

DEPLOYMENT = typer.Option(..., "--deployment", "-d", help="Deployment name.")
BLOCKS = typer.Option(None, "--blocks", help="Blocks of two periods (default: the deployment's).")


@contextmanager
def _progress(ctx: Ctx):
    """A status line for long runs (silent under --json)."""
    if ctx.json:
        yield lambda _msg: None
        return
    with console.status("starting") as status:
        yield lambda msg: status.update(f"[bold]{msg}")


def phase0(ctx: typer.Context, deployment: str = DEPLOYMENT, blocks: int | None = BLOCKS) -> None:
    """Phase 0: δ from stock vs AR, stock's token-forcing figures, stock noise σ."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    from specpilot import controller  # torch and scipy load only for the commands that judge

    with _progress(c) as progress:
        figures = controller.run_phase0(dep, c.home, blocks=blocks, progress=progress)

    def render(con: Console) -> None:
        t = Table(title=f"Phase 0 — {dep.name}", show_header=False)
        s, a, n = figures["stock"], figures["ar"], figures["noise"]
        t.add_row("δ (near-tie threshold)", f"{figures['delta']:.3f} nat")
        t.add_row(
            "first divergences stock vs AR",
            f"{len(figures['divergences'])} of {figures['requests']} requests",
        )
        t.add_row(
            "stock mismatch rate", f"{s['rate']:.2%} ({s['mismatches']}/{s['positions']}), ≥2δ: {s['large']}"
        )
        t.add_row(
            "AR mismatch rate", f"{a['rate']:.2%} ({a['mismatches']}/{a['positions']}), ≥2δ: {a['large']}"
        )
        t.add_row(
            "stock noise σ",
            f"{n['sigma']:.2%} ({n['design']} design, {n['n']} blocks, pooled block sd {n['pooled_sd']:.2%}; A/A gain {n['gain']:.4f})",
        )
        con.print(t)

    emit(c, figures, render)


@app.command()
def noise(ctx: typer.Context, deployment: str = DEPLOYMENT, blocks: int | None = BLOCKS) -> None:
    """Stock against itself (A/A) in the paired design: the noise σ approval is held to."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    from specpilot import controller  # torch and scipy load only for the commands that judge

    with _progress(c) as progress:
        figures = controller.measure_noise(dep, c.home, blocks=blocks, progress=progress)

    def render(con: Console) -> None:
        con.print(
            f"stock noise σ = [bold]{figures['sigma']:.2%}[/] ({figures['design']} design, {figures['n']} blocks; pooled block sd {figures['pooled_sd']:.2%}); "
            f"A/A gain {figures['gain']:.4f}, lower bound {figures['lower_bound']:.4f}; "
            f"per-block {', '.join(f'{g:.3f}' for g in figures['block_gains'])}"
        )

    emit(c, figures, render)


@app.command()
def compare(
    ctx: typer.Context,
    deployment: str = DEPLOYMENT,
    baseline: str = typer.Option(..., help="Baseline revision in the workspace (branch, tag, commit, tree)."),
    candidate: str = typer.Option(..., help="Candidate revision in the workspace."),
    blocks: int | None = BLOCKS,
    audit: bool = typer.Option(True, help="Audit the candidate's output by token forcing."),
) -> None:
    """Paired, slot-swapped comparison of a candidate against a baseline, with its verdict."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    from specpilot import controller  # torch and scipy load only for the commands that judge

    with _progress(c) as progress:
        ev = controller.compare(
            dep, c.home, baseline, candidate, blocks=blocks, audit_output=audit, progress=progress
        )
    data = verdict_json(ev)
    emit(c, data, lambda con: print_verdict(con, data))


@app.command("audit")
def audit_(
    ctx: typer.Context,
    deployment: str = DEPLOYMENT,
    system: str = typer.Option(..., help="Revision of the system to audit."),
) -> None:
    """Token-forcing audit of one system against stock's Phase 0 figures."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    from specpilot import controller  # torch and scipy load only for the commands that judge

    with _progress(c) as progress:
        data = controller.audit_system(dep, c.home, system, progress=progress)

    def render(con: Console) -> None:
        ok = "[green]passes[/]" if data["passed"] else "[red]rejected[/]"
        con.print(f"audit of {data['tree'][:12]}: {ok}")
        con.print(
            f"  mismatch rate {data['rate']:.2%} ({data['mismatches']}/{data['positions']}) vs stock "
            f"{data['stock_rate']:.2%} ({data['stock_mismatches']}/{data['stock_positions']}); δ = {data['delta']:.3f}"
        )
        con.print(
            f"  ≥2δ events {data['large']} vs stock {data['stock_large']} (one-sided Fisher exact p = "
            f"{data['p_large']:.3g}); unexplained {data['unexplained']}"
        )
        for r in data["reasons"]:
            con.print(f"  • {r}")
        for e in data["events"][:10]:
            why = "explained" if e["explained"] else "unexplained"
            con.print(
                f"  {e['id']} @{e['position']}: margin {e['margin']:.3f} ({why}) …{e.get('context', '')}…"
            )

    emit(c, data, render)


def round_number(ident: str) -> int | None:
    """A round number, or None for a verdict or run id prefix: ids are hex, so a prefix such as
    `71761649` is all digits about 2% of the time; a round number has at most 5."""
    return int(ident) if ident.isdigit() and len(ident) <= 5 else None


def report(
    ctx: typer.Context,
    ident: str = typer.Argument(
        None,
        help="Round number (up to 5 digits), or verdict or run id (a prefix will do; 6+ characters if all digits).",
    ),
    deployment: str = typer.Option(None, "--deployment", "-d", help="Deployment of the round."),
) -> None:
    """A round's approval report, or a stored verdict's; without an argument, the latest verdicts."""
    c: Ctx = ctx.obj
    if ident is not None and round_number(ident) is not None:
        from .cli_round import round_report

        round_report(c, deployment, int(ident))
        return
    db = connect(c.home)
    verdicts = records.list_verdicts(db)
    if ident is None:
        rows = [verdict_json(v) for v in verdicts[-20:]]
        emit(c, rows, lambda con: con.print(verdict_list(rows)))
        return
    hits = [v for v in verdicts if v.id.startswith(ident) or (v.run_id or "").startswith(ident)]
    if not hits:
        raise SpecPilotError(f"no verdict or run {ident!r} in {db.url}; `specpilot report` lists the latest")
    data = verdict_json(hits[-1])
    emit(c, data, lambda con: print_verdict(con, data))
