"""`specpilot round`: the main job, with live progress and the approval report."""

from __future__ import annotations

import time

import typer
from rich.live import Live
from rich.text import Text

from specpilot.deployments import SpecPilotError, load_deployment
from specpilot.memory_store import connect, records

from .agents import AGENTS, agent_options, default_agent
from .output import Ctx, console, emit
from .reports import round_panel


def round_(
    ctx: typer.Context,
    deployment: str = typer.Option(..., "--deployment", "-d", help="Deployment name."),
    agent: str = typer.Option(
        None, help=f"Agent backend: {' or '.join(AGENTS)} (default: claude with a key, else memory)."
    ),
    rounds: int = typer.Option(1, min=1, help="Rounds to run, each from the last sealed system."),
    resume: int = typer.Option(None, help="Continue round N where it stopped (after a crash or kill)."),
    model: str = typer.Option(None, help="claude: the model (default: <home>/claude.toml, else the CLI's)."),
    max_turns: int = typer.Option(None, min=1, help="claude: model turns per agent run (default 200)."),
    budget_usd: float = typer.Option(None, min=0.01, help="claude: dollars per agent run (default 10)."),
    ray: str = typer.Option(
        None,
        "--ray",
        help="Run the device work on this Ray cluster's nodes (ADDRESS, e.g. head:6379); "
        "the memory must be a PostgreSQL every node reaches (SPECPILOT_DB_URL).",
    ),
    directions: int = typer.Option(
        None, min=1, help="--ray: directions to plan (default: as many as the cluster's slots judge at once)."
    ),
) -> None:
    """Run optimization rounds: cost model → directions → patches → paired judgement → sealed system."""
    from .round import start_or_resume  # the controller, torch and scipy load for the commands that judge

    c: Ctx = ctx.obj
    dep = load_deployment(deployment, c.home)
    agent = agent or default_agent()
    if agent not in AGENTS:
        raise SpecPilotError(f"unknown agent {agent!r}; use one of {', '.join(AGENTS)}")
    options = agent_options(agent, c.home, model=model, max_turns=max_turns, budget_usd=budget_usd)
    cluster = None
    if directions is not None and ray is None:
        raise SpecPilotError("--directions applies to a round on a Ray cluster (--ray ADDRESS)")
    if ray is not None:
        from .cluster import Cluster

        cluster = Cluster(ray, c.home.db_url)
    reports = []
    for k in range(rounds):
        t0 = time.monotonic()
        line = Text("")

        def progress(step: str, msg: str, t0: float = t0, line: Text = line) -> None:
            line.plain = f"[{time.monotonic() - t0:6.0f}s] {step}: {msg}"
            if not console.is_terminal:  # Live draws nothing into a log or pipe: a line per step there
                console.print(line.plain, highlight=False, soft_wrap=True)

        if c.json:
            rnd = start_or_resume(dep, c.home, agent, resume if k == 0 else None, lambda *_: None, options,
                                  rounds_left=rounds - k - 1, cluster=cluster, width=directions)  # fmt: skip
            state = rnd.run()
        else:
            with Live(line, console=console, refresh_per_second=4, transient=True):
                rnd = start_or_resume(dep, c.home, agent, resume if k == 0 else None, progress, options,
                                      rounds_left=rounds - k - 1, cluster=cluster, width=directions)  # fmt: skip
                line.plain = f"round {rnd.number} of {dep.name} (agent {rnd.state.agent})"
                state = rnd.run()
        reports.append({"deployment": dep.name, "round": rnd.number, "status": "done",
                        "elapsed_s": time.monotonic() - t0, **state})  # fmt: skip
        if not c.json:
            console.print(round_panel(dep.name, rnd.number, "done", state))
            console.print(f"round {rnd.number} took {time.monotonic() - t0:.0f}s")
    if c.json:
        emit(c, reports if rounds > 1 else reports[0], lambda _con: None)


def round_report(ctx: Ctx, deployment: str | None, number: int) -> None:
    """Re-render a stored round's approval report."""
    db = connect(ctx.home)
    if deployment is None:
        deps = records.round_deployments(db)
        if len(deps) != 1:
            raise SpecPilotError(f"rounds exist for {deps or 'no deployment'}; name one with --deployment")
        deployment = deps[0]
    rec = records.get_round(db, deployment, number)
    if rec is None:
        raise SpecPilotError(f"deployment {deployment!r} has no round {number}")
    data = {"deployment": deployment, "round": number, "status": rec.status, **rec.state}
    emit(ctx, data, lambda con: con.print(round_panel(deployment, number, rec.status, rec.state)))
