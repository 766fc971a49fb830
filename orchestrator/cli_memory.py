"""`specpilot memory list|show|graph|add|export|import|replay|restock`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.tree import Tree

import specpilot.memory_store as ms  # its parts load on first use: other commands stay quick
from specpilot.deployments import SpecPilotError, load_deployment
from specpilot.memory_store import Workspace

from .output import Ctx, emit

app = typer.Typer(
    help="The memory: verified mechanisms stored as entries that reproduce the exact code.",
    no_args_is_help=True,
)


def _split(names: str | None) -> list[str]:
    return [n.strip() for n in (names or "").split(",") if n.strip()]


def _summary_row(e: ms.Entry) -> dict:
    return {
        "name": e.name,
        "engine": e.engine,
        "requires": e.requires,
        "target_factor": e.target_factor,
        "variants": [v.knob for v in e.variants],
        "contracts": e.contracts,
        "tree": e.tree,
        "summary": e.summary,
        **e.delta_stats(),
    }


@app.command("list")
def list_(
    ctx: typer.Context, engine: str | None = typer.Option(None, help="Only entries of this engine.")
) -> None:
    """Every entry, one line each."""
    c: Ctx = ctx.obj
    rows = [_summary_row(e) for e in ms.open_memory(c.home).entries(engine)]

    def render(con: Console) -> None:
        if not rows:
            con.print(
                "the memory is empty; add entries with `specpilot memory add` or `memory import --builtin refspec`"
            )
            return
        table = Table(title=f"Memory ({len(rows)} entries)")
        for col in ("name", "engine", "requires", "factor", "variants", "delta", "tree", "summary"):
            table.add_column(col)
        for r in rows:
            delta = f"{r['files']} files +{r['added']} -{r['removed']}"
            table.add_row(
                r["name"],
                r["engine"],
                ", ".join(r["requires"]) or "-",
                r["target_factor"],
                ", ".join(r["variants"]) or "-",
                delta,
                r["tree"][:12],
                r["summary"],
            )
        con.print(table)

    emit(c, rows, render)


@app.command()
def show(
    ctx: typer.Context,
    name: str = typer.Argument(help="Entry name."),
    delta: bool = typer.Option(False, "--delta", help="Print the code delta too."),
) -> None:
    """One entry: its base, requirements, variants, contracts, evidence, limits and delta."""
    c: Ctx = ctx.obj
    memory = ms.open_memory(c.home)
    e = memory.get(name)
    required_by = sorted(x.name for x in memory.entries() if name in x.requires)
    data = e.as_dict(delta=delta) | {"required_by": required_by, "delta_stats": e.delta_stats()}

    def render(con: Console) -> None:
        con.print(f"[bold]{e.name}[/] ({e.engine}) — {e.summary or 'no summary'}")
        con.print(f"  stock tree   {e.stock_tree}")
        con.print(f"  tree         {e.tree}")
        con.print(f"  requires     {', '.join(e.requires) or '-'}")
        con.print(f"  required by  {', '.join(required_by) or '-'}")
        con.print(f"  target       {e.target_factor}")
        con.print(f"  contracts    {', '.join(e.contracts) or '-'}")
        s = data["delta_stats"]
        con.print(f"  delta        {s['files']} files, +{s['added']} -{s['removed']}")
        for v in e.variants:
            con.print(f"  variant      {v.knob} in {v.file}: {v.values} (default {v.default!r})")
        for k, v in e.options.items():
            con.print(f"  option       {k} = {v!r}")
        for ev in e.evidence:
            con.print(f"  evidence     {json.dumps(ev, sort_keys=True)}")
        for x in e.limits:
            con.print(f"  limit        {x}")
        for x in e.unverified:
            con.print(f"  unverified   {x}")
        if delta and e.delta:
            con.print(Syntax(e.delta, "diff", theme="ansi_dark", word_wrap=True))

    emit(c, data, render)


@app.command()
def graph(
    ctx: typer.Context, name: str | None = typer.Argument(None, help="Only this entry and its requirements.")
) -> None:
    """The requirement DAG: each entry above the entries it requires."""
    c: Ctx = ctx.obj
    memory = ms.open_memory(c.home)
    known = memory.by_name()
    entries = memory.resolve([name], known) if name else list(known.values())
    edges = [[e.name, r] for e in entries for r in e.requires]
    data = {"nodes": [e.name for e in entries], "edges": edges}
    required = {r for _, r in edges}
    roots = [name] if name else [e.name for e in entries if e.name not in required]

    def render(con: Console) -> None:
        if not entries:
            con.print("the memory is empty")
            return
        top = Tree(f"[bold]memory[/] ({len(entries)} entries, {len(edges)} requirements)")
        shown: set[str] = set()

        def grow(node: Tree, n: str) -> None:
            if n in shown and known[n].requires:
                node.add(f"{n} [dim](see above)[/]")
                return
            shown.add(n)
            child = node.add(f"[bold]{n}[/] [dim]{known[n].tree[:12]}[/]")
            for r in known[n].requires:
                grow(child, r)

        for r in roots:
            grow(top, r)
        con.print(top)

    emit(c, data, render)


def _meta(path: Path | None, summary: str | None, factor: str | None, contracts: list[str]) -> ms.EntryMeta:
    from pydantic import ValidationError

    from specpilot.memory_store import describe

    raw: dict = {}
    if path is not None:
        try:
            text = path.read_text()
            raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except FileNotFoundError:
            raise SpecPilotError(f"{path}: no such metadata file") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
            raise SpecPilotError(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {err}") from None
        if not isinstance(raw, dict):
            raise SpecPilotError(f"{path}: entry metadata must be an object")
    raw |= {"summary": summary} if summary is not None else {}
    raw |= {"target_factor": factor} if factor is not None else {}
    raw |= {"contracts": [*raw.get("contracts", []), *contracts]} if contracts else {}
    try:
        return ms.EntryMeta.model_validate(raw)
    except ValidationError as err:
        raise SpecPilotError(f"{path or 'entry metadata'}: {describe(err)}") from None


def _stock(memory: ms.Memory, deployment: str | None, engine: str | None) -> ms.StockTree:
    if deployment is not None:
        return memory.stock_for(load_deployment(deployment, memory.home))
    engine = engine or "refspec"
    stocks = memory.stocks(engine)
    if len(stocks) != 1:
        raise SpecPilotError(
            f"engine {engine!r} has {len(stocks)} stock trees here; name the base with --deployment"
        )
    return stocks[0]


@app.command()
def add(
    ctx: typer.Context,
    name: str = typer.Argument(help="New entry name (lowercase letters, digits, '-')."),
    dir: Path | None = typer.Option(None, "--dir", help="A folder holding the whole tree to store."),
    worktree: str | None = typer.Option(
        None, "--worktree", help="A workspace worktree (needs --deployment)."
    ),
    deployment: str | None = typer.Option(
        None, "--deployment", "-d", help="Deployment whose stock is the base."
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="Engine whose stock is the base (default refspec)."
    ),
    requires: str | None = typer.Option(
        None, "--requires", help="Comma-separated entries this one builds on."
    ),
    meta: Path | None = typer.Option(
        None, "--meta", help="JSON/TOML: summary, variants, contracts, evidence..."
    ),
    summary: str | None = typer.Option(None, "--summary", help="One line: what the mechanism does."),
    target_factor: str | None = typer.Option(None, "--target-factor", help="tree | kernel | outside | none."),
    contract: list[str] = typer.Option(
        [], "--contract", help="A correctness contract (repeatable): lossless..."
    ),
) -> None:
    """Store a tree as an entry: its delta against stock + requirements, sealed by tree hash."""
    c: Ctx = ctx.obj
    if (dir is None) == (worktree is None):
        raise SpecPilotError("give the tree to store with exactly one of --dir PATH or --worktree ID")
    if worktree is not None:
        if deployment is None:
            raise SpecPilotError("--worktree needs --deployment: the workspace it belongs to")
        source = Workspace.open(c.home, deployment).root / "worktrees" / worktree
        if not source.is_dir():
            raise SpecPilotError(f"workspace {deployment!r} has no worktree {worktree!r} ({source})")
    else:
        source = dir  # type: ignore[assignment]
    memory = ms.open_memory(c.home)
    entry = ms.add_entry(
        memory,
        name,
        source,
        _stock(memory, deployment, engine),
        _split(requires),
        _meta(meta, summary, target_factor, contract),
    )
    data = _summary_row(entry) | {"stock_tree": entry.stock_tree}

    def render(con: Console) -> None:
        con.print(
            f"added [bold]{entry.name}[/]: {data['files']} files +{data['added']} -{data['removed']} on "
            f"stock {entry.stock_tree[:12]} + {', '.join(entry.requires) or 'no requirements'}"
        )
        con.print(f"  tree {entry.tree} (reproduced from stock + requirements + delta)")

    emit(c, data, render)


@app.command("export")
def export(
    ctx: typer.Context,
    out: Path = typer.Argument(help="Bundle folder to write (new, or an old bundle with --force)."),
    entries: str | None = typer.Option(None, "--entries", help="Comma-separated entries (default: all)."),
    force: bool = typer.Option(False, "--force", help="Replace the bundle already in OUT."),
) -> None:
    """Write entries and their requirements as a bundle: bundle.json + one .patch per entry."""
    c: Ctx = ctx.obj
    names = ms.export_bundle(ms.open_memory(c.home), out, _split(entries) or None, force=force)
    emit(
        c,
        {"bundle": str(out), "entries": names},
        lambda con: con.print(f"exported {len(names)} entries to {out}: {', '.join(names)}"),
    )


@app.command("import")
def import_(
    ctx: typer.Context,
    bundle: Path | None = typer.Argument(None, help="Bundle folder."),
    builtin: str | None = typer.Option(
        None, "--builtin", help="Import SpecPilot's built-in bundle of this engine."
    ),
) -> None:
    """Import a bundle: every new entry is rebuilt from stock and checked before anything is stored."""
    c: Ctx = ctx.obj
    if (bundle is None) == (builtin is None):
        raise SpecPilotError("give exactly one of a BUNDLE folder or --builtin ENGINE")
    if builtin is not None:
        shipped = ms.builtin_bundles()
        if builtin not in shipped:
            raise SpecPilotError(
                f"no built-in bundle for engine {builtin!r}; built in: {', '.join(shipped) or 'none'}"
            )
        bundle = shipped[builtin]
    res = ms.import_bundle(ms.open_memory(c.home), bundle)  # type: ignore[arg-type]
    data = {"bundle": str(bundle), "added": res.added, "present": res.present, "unchecked": res.unchecked}

    def render(con: Console) -> None:
        con.print(f"imported {len(res.added)} entries from {bundle}: {', '.join(res.added) or '-'}")
        if res.present:
            con.print(f"  already present (same code): {', '.join(res.present)}")
        if res.unchecked:
            con.print(f"  evidence naming verdicts this store does not hold (kept, not checked): "
                      f"{', '.join(res.unchecked)}")  # fmt: skip

    emit(c, data, render)


@app.command("replay")
def replay_(
    ctx: typer.Context,
    deployment: str = typer.Option(..., "--deployment", "-d", help="Deployment whose stock is the base."),
    entries: str = typer.Option("", "--entries", help="Comma-separated entries; requirements come along."),
    out: Path | None = typer.Option(None, "--out", help="Write the system's tree to this new folder."),
    seal: bool = typer.Option(False, "--seal", help="Also record it as a sealed system of the deployment."),
) -> None:
    """Build a system from stock and chosen entries; print its tree hash."""
    c: Ctx = ctx.obj
    memory = ms.open_memory(c.home)
    dep = load_deployment(deployment, c.home)
    r = ms.replay(memory, dep, _split(entries), out)
    if seal:
        ms.seal_system(memory, dep, r.entries, r.tree)
    data = {
        "deployment": dep.name,
        "stock": r.stock.label,
        "stock_tree": r.stock_tree,
        "entries": r.entries,
        "tree": r.tree,
        "out": str(out) if out else None,
        "sealed": seal,
    }

    def render(con: Console) -> None:
        con.print(f"{dep.name}: stock {r.stock_tree[:12]} + {', '.join(r.entries) or 'no entries'}")
        con.print(f"tree {r.tree}")
        if out:
            con.print(f"written to {out}")
        if seal:
            con.print("sealed as a system of " + dep.name)

    emit(c, data, render)


@app.command()
def restock(
    ctx: typer.Context, bundle: Path = typer.Argument(help="Bundle folder to rewrite in place.")
) -> None:
    """Rebase a bundle onto its engine's current stock tree (maintainers, after a stock change)."""
    c: Ctx = ctx.obj
    names = ms.restock_bundle(bundle, lambda engine: ms.engine_stocks(engine, c.home))
    emit(
        c,
        {"bundle": str(bundle), "entries": names},
        lambda con: con.print(f"restocked {len(names)} entries in {bundle}"),
    )
