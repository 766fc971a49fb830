"""`specpilot`: the command line. Global options here; command groups in cli_<group>.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import click
import typer

from specpilot.deployments import Home

from . import (
    cli_controller,
    cli_costmodel,
    cli_deployments,
    cli_memory,
    cli_round,
    cli_seal,
    cli_workloads,
    cli_workspace,
)
from .output import Ctx, err_console

app = typer.Typer(
    name="specpilot",
    help="Find where a speculative-decoding deployment leaks speed, and fix it with verified patches.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(cli_deployments.app, name="deployments")
app.add_typer(cli_workspace.app, name="workspace")
cli_costmodel.register(app)
app.add_typer(cli_workloads.app, name="workloads")
app.add_typer(cli_memory.app, name="memory")
app.command("seal-check")(cli_seal.seal_check)
app.add_typer(cli_controller.app, name="controller")
app.command("phase0")(cli_controller.phase0)
app.command("report")(cli_controller.report)
app.command("round")(cli_round.round_)


@app.callback()
def _global(
    ctx: typer.Context,
    home: Annotated[
        Path | None,
        typer.Option(
            envvar="SPECPILOT_HOME",
            help="State folder (database, workspaces, runs, cache).",
            show_default="./.specpilot",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    ctx.obj = Ctx(home=Home.resolve(home), json=json_out)


def _usage_errors() -> tuple[type, ...]:
    """Usage errors of click and of the click copy that newer typer versions vendor."""
    try:
        from typer._click.exceptions import ClickException as Vendored
    except ImportError:
        return (click.ClickException,)
    return (click.ClickException, Vendored)


USAGE_ERRORS = _usage_errors()


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except USAGE_ERRORS as e:
        e.show()
        sys.exit(e.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as e:
        if not getattr(e, "is_user_error", False):
            raise
        err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2))
    sys.exit(code or 0)
