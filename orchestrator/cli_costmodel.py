"""`specpilot costmodel` and `specpilot replay-tau`: where a system leaks speed (ARCHITECTURE §7)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from specpilot.costmodel import (
    BUDGETS,
    TREE_POLICIES,
    CostReport,
    ReplayTable,
    cached_record,
    label_sets,
    load_records,
    measure,
    replay_table,
    tree_digest,
)
from specpilot.deployments import Deployment, Home, SpecPilotError, load_deployment
from specpilot.memory_store import SYSTEM_BRANCH, Workspace, git_bytes, safe_extract, stock_source

from .output import Ctx, emit

DEPLOYMENT = typer.Option(..., "--deployment", "-d", help="Deployment name.")
SYSTEM = typer.Option(
    None, "--system", help="A revision of the deployment's workspace (default: the current system)."
)
RECORD = typer.Option(
    None, "--record", help="A recording (CONTRACTS §4); default: record the system on its slot."
)
REQUESTS = typer.Option(None, "--requests", help="Request file (JSONL); default: the deployment's workload.")
SLOT = typer.Option(None, "--slot", help="Device slot to run on (default: the deployment's first).")


def register(app: typer.Typer) -> None:
    """Add the cost-model commands to the root app."""
    app.command("costmodel")(costmodel)
    app.command("replay-tau")(replay_tau)


def system_tree(dep: Deployment, home: Home, rev: str | None) -> tuple[Path, str]:
    """(folder holding the system's source tree, its name): a workspace revision exported under
    the home (by git tree hash), or the pristine stock tree when there is no workspace."""
    if not Workspace.exists(home, dep.name):
        if rev is not None:
            raise SpecPilotError(
                f"--system {rev}: deployment {dep.name!r} has no workspace; run "
                f"`specpilot workspace init --deployment {dep.name}` or leave out --system"
            )
        src = stock_source(dep)
        return src, f"stock ({tree_digest(src)[:12]}, no workspace)"
    ws = Workspace.open(home, dep.name)
    tree_hash = ws.tree_hash(rev or SYSTEM_BRANCH)
    dest = home.runs / "costmodel" / "trees" / tree_hash
    if not dest.is_dir():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tar = git_bytes(ws.repo_dir, "archive", "--format=tar", tree_hash)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".export-"))
        try:
            with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
                safe_extract(tf, tmp)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest, tree_hash


def request_path(dep: Deployment, home: Home, given: Path | None) -> Path:
    """The request file to run: the one given, else the deployment's workload (CONTRACTS §6)."""
    if given is not None:
        if not given.is_file():
            raise SpecPilotError(f"{given}: no such request file")
        return given
    try:
        from specpilot.deployments.workloads import request_file
    except ImportError:
        raise SpecPilotError(
            "this build has no workload request files (specpilot.deployments.workloads); "
            "pass --requests FILE, or --profile and --record"
        ) from None
    return request_file(dep, home)


def _jail(dep: Deployment, home: Home):
    """The controller's confinement for a system's own cost-model tools, imported only by the
    commands that run one: the controller loads torch and scipy, and every other command of the
    CLI starts without them."""
    from specpilot.controller import tool_jail

    return tool_jail(dep, home)


def costmodel(
    ctx: typer.Context,
    deployment: str = DEPLOYMENT,
    system: str | None = SYSTEM,
    profile: Path | None = typer.Option(
        None, "--profile", help="A step profile (CONTRACTS §5); default: profile the system."
    ),
    record: Path | None = RECORD,
    requests: Path | None = REQUESTS,
    slot: str | None = SLOT,
    budget: int | None = typer.Option(
        None, "--budget", help="Node budget for F_tree (default: the system's)."
    ),
    max_requests: int | None = typer.Option(
        None, "--max-requests", help="Profile only the first N requests."
    ),
    reprobe: bool = typer.Option(
        False, "--reprobe", help="Measure a CPU's peaks again instead of using the cache."
    ),
) -> None:
    """τ, c, speedup, kernel time per class vs byte floor, and the ceiling's three factors."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    need_tree = profile is None or record is None
    tree, name = system_tree(dep, c.home, system) if need_tree else (None, system)
    report = measure(
        dep,
        c.home,
        tree=tree,
        slot=slot,
        requests=request_path(dep, c.home, requests) if need_tree else None,
        system=name,
        profile=profile,
        record=record,
        budget=budget,
        max_requests=max_requests,
        reprobe=reprobe,
        jail=_jail(dep, c.home) if need_tree else None,
    )
    emit(c, report.to_dict(), lambda con: render_report(con, report))


def replay_tau(
    ctx: typer.Context,
    deployment: str = DEPLOYMENT,
    system: str | None = SYSTEM,
    record: Path | None = RECORD,
    requests: Path | None = REQUESTS,
    slot: str | None = SLOT,
    budgets: str = typer.Option(
        ",".join(map(str, BUDGETS)), "--budgets", help="Node budgets, comma-separated."
    ),
) -> None:
    """τ per tree policy and node budget, and the top-16 oracle, by exact replay of recordings."""
    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    try:
        sizes = sorted({int(b) for b in budgets.split(",") if b.strip()})
    except ValueError:
        raise SpecPilotError(f"--budgets {budgets!r}: give positive integers, e.g. 8,16,32,64") from None
    if not sizes or min(sizes) < 1:
        raise SpecPilotError(f"--budgets {budgets!r}: give positive integers, e.g. 8,16,32,64")
    if record is None:
        tree, _ = system_tree(dep, c.home, system)
        requests = request_path(dep, c.home, requests)
        _, records = cached_record(
            tree,
            slot or dep.devices.slots[0],
            requests,
            c.home,
            model=dep.target.model,
            jail=_jail(dep, c.home),
        )
    else:
        records = load_records(record)
    records = label_sets(records, requests)
    table = replay_table(records, sizes)
    emit(c, table.to_dict(), lambda con: render_replay(con, table))


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def render_report(con: Console, r: CostReport) -> None:
    dev = r.device
    bw = (
        f"{dev['bandwidth'] / 1e12:.3g} TB/s"
        if dev["bandwidth"] >= 1e11
        else f"{dev['bandwidth'] / 1e9:.3g} GB/s"
    )
    flops = dev["flops"].get(r.dtype) or next(iter(dev["flops"].values()))
    con.print(f"[bold]cost model[/] — {r.deployment}, system {r.system or '(given profile)'}")
    con.print(
        f"  device {dev['name']} ({dev['source']}): {flops / 1e12:.3g} TFLOP/s {r.dtype}, {bw}; "
        f"rows/step N = {r.rows_per_step:.2f}, batch {r.batch}, context {r.context_len:.0f}"
    )
    top = Table(title="speedup over AR = τ / c")
    for col in ("τ", "T_step ms", "T_AR ms", "c", "speedup"):
        top.add_column(col, justify="right")
    top.add_row(f"{r.tau:.3f}", _ms(r.step_wall_s), _ms(r.ar_step_wall_s), f"{r.c:.3f}", f"{r.speedup:.3f}×")
    con.print(top)
    cls = Table(title="kernel time per step vs byte floor")
    for col in ("class", "time ms", "floor ms", "× floor", "bound", "MB", "GFLOP"):
        cls.add_column(col, justify="right" if col != "class" else "left")
    for k in r.classes:
        ratio = f"{k.ratio:.2f}" if k.ratio is not None else "—"
        cls.add_row(
            k.name,
            _ms(k.time_s),
            _ms(k.floor_s),
            ratio,
            k.bound,
            f"{k.bytes / 1e6:.1f}",
            f"{k.flops / 1e9:.2f}",
        )
    cls.add_row("[bold]total[/]", _ms(r.profiled_s), _ms(r.floor_s), f"{r.f_kernel:.2f}", "", "", "")
    con.print(cls)
    fac = Table(title="ceiling = speedup × F_tree × F_kernel × F_outside")
    for col in ("factor", "value", "what"):
        fac.add_column(col)
    what = {
        "tree": f"τ of {r.best_policy} at {r.budget} nodes = {r.tau_best:.3f} vs τ now {r.tau:.3f}",
        "kernel": f"profiled {_ms(r.profiled_s)} ms vs byte floor {_ms(r.floor_s)} ms",
        "outside": f"step wall {_ms(r.step_wall_s)} ms vs profiled {_ms(r.profiled_s)} ms",
    }
    for name, value in r.factors.items():
        mark = "[bold green]" if name == r.largest else ""
        end = "[/]" if mark else ""
        fac.add_row(f"{mark}F_{name}{end}", f"{mark}{value:.3f}{end}", what[name])
    fac.add_row("[bold]ceiling[/]", f"[bold]{r.ceiling:.3f}×[/]", f"largest factor: [bold]{r.largest}[/]")
    con.print(fac)
    if r.tau_chain_replay is not None:
        con.print(f"  replayed chain τ {r.tau_chain_replay:.3f} (profiled τ {r.tau:.3f}, mode {r.mode})")
    for note in r.notes:
        con.print(f"  [yellow]note:[/] {note}")


def render_replay(con: Console, t: ReplayTable) -> None:
    sets = sorted({s for r in t.results for s in r.per_set})
    for name in [None, *sets] if len(sets) > 1 else [None]:
        count = t.set_sizes.get(name, 0) if name else t.requests
        noun = "request" if count == 1 else "requests"
        title = f"τ by exact replay — {name or 'all requests'} ({count} {noun}, block {t.block_size})"
        tab = Table(title=title)
        tab.add_column("policy")
        for b in t.budgets:
            tab.add_column(f"{b} nodes", justify="right")
        for policy in TREE_POLICIES:
            cells = []
            for b in t.budgets:
                r = next(x for x in t.results if x.policy == policy and x.budget == b)
                cells.append(f"{(r.per_set.get(name, 0.0) if name else r.tau):.3f}")
            tab.add_row(policy, *cells)
        oracle = next(x for x in t.results if x.policy == "oracle")
        tau = oracle.per_set.get(name, 0.0) if name else oracle.tau
        tab.add_row("oracle (top-16, no budget)", *[f"{tau:.3f}"] * len(t.budgets))
        con.print(tab)
