"""`asyncgrpo run create | list`: the runs API (docs/guides/real-run.md,
docs/guides/projects.md) through the typed client (protocol/client.py) with an admin token."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from asyncgrpo.api_cli import AS_JSON, PROJECT, PROJECT_FILTER, SERVER, TOKEN, call, fail
from asyncgrpo.help_layout import App

run_app = App(help="Runs on a control plane: create one from a run config, list them.",
              no_args_is_help=True)  # fmt: skip

RUN_FILE = typer.Argument(
    ...,
    exists=True,
    dir_okay=False,
    help="A JSON run config (docs/reference/run-config.md), e.g. examples/runs/arithmetic.json.",
)


@run_app.command("create")
def create(
    file: Path = RUN_FILE,
    project: str = PROJECT,
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Create a run from FILE in a project (POST /api/v1/runs): prints its id, status and
    project, and its learner token with the `asyncgrpo learner` command that uses it (the
    token is shown only now). A refused config exits 2 with the field named."""
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"{file}: not a JSON file ({exc})")
    created = call(server, token, lambda c: c.create_run(config, project=project))
    if as_json:
        typer.echo(json.dumps(created, indent=2))
        return
    run = created["run"]
    typer.echo(f"run {run['id']}  {run['status']}  project {run['project']}  {run['name']}")
    typer.echo("learner token (shown once):")
    typer.echo(
        f"asyncgrpo learner --server {server} --run {run['id']} --token {created['learner_token']}"
    )


@run_app.command("list")
def list_runs(
    project: str = PROJECT_FILTER,
    status: str = typer.Option(None, help="Only runs in this state.", show_default="any"),
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Runs, newest first: id, status, version, project, name."""
    runs = call(server, token, lambda c: c.list_runs(status=status, project=project))
    if as_json:
        typer.echo(json.dumps(runs, indent=2))
        return
    for r in runs:
        version = r["current_version"]
        typer.echo(f"{r['id']}  {r['status']:16} v{version:<5} {r['project']}  {r['name']}")
