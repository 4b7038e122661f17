"""`asyncgrpo sweep create | list | show | pause | resume | cancel`: the sweeps API
(docs/guides/sweeps.md) through the typed client (protocol/client.py) with an admin token."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from asyncgrpo.api_cli import AS_JSON, PROJECT_FILTER, SERVER, TOKEN, call, fail
from asyncgrpo.help_layout import App

sweep_app = App(
    help="Sweeps: many runs from one base config and a grid of overrides.", no_args_is_help=True
)

SWEEP_ID = typer.Argument(..., help="The sweep's id (asyncgrpo sweep list).")
REASON = typer.Option(
    None, help="Why; shown as each moved run's status reason.", show_default="none"
)


def learner_env_lines(created: dict[str, Any]) -> list[str]:
    """The --learner-env format: per run, in the sweep's order, a comment naming it and one
    line of the two variables `asyncgrpo learner` reads (ids and tokens need no quoting)."""
    lines = []
    for learner in created["learners"]:
        lines.append(f"# {learner['name']}")
        lines.append(
            f"ASYNCGRPO_LEARNER_RUN_ID={learner['run_id']} "
            f"ASYNCGRPO_LEARNER_TOKEN={learner['learner_token']}"
        )
    return lines


def _write_private(path: Path, text: str) -> None:
    """Create `path` readable by its owner only (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


SWEEP_FILE = typer.Argument(
    ...,
    exists=True,
    dir_okay=False,
    help='A JSON sweep: {"name", "base": <run config>, "grid": {path: [values]}} or '
    '"overrides": [{path: value}, ...] instead of "grid".',
)
LEARNER_ENV = typer.Option(
    None,
    "--learner-env",
    help="Write each run's learner credentials here (a new file, mode 0600): per run a "
    "`# <run name>` line, then `ASYNCGRPO_LEARNER_RUN_ID=<id> ASYNCGRPO_LEARNER_TOKEN=<token>` "
    "on one line. Without it they are printed (shown once either way).",
    show_default="print them",
)


@sweep_app.command("create")
def create(
    file: Path = SWEEP_FILE,
    learner_env: Path = LEARNER_ENV,
    project: str = typer.Option(
        None,
        "--project",
        help="The project (name or id) of the sweep and its runs, in place of the file's "
        '"project"; 422 unknown_project when none has it.',
        show_default="the file's, else default",
    ),
    server: str = SERVER,
    token: str = TOKEN,
) -> None:
    """Create a sweep: every combination is validated before any run is made (422 naming the
    combination and the field; nothing is created), then all its runs at once, in its
    project."""
    try:
        body = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        fail(f"{file}: not a JSON file ({exc})")
    if project is not None:
        body["project"] = project
    if learner_env is not None and learner_env.exists():
        fail(f"--learner-env {learner_env} exists: name a new file (its tokens are shown once)")
    created = call(server, token, lambda c: c.create_sweep(body))
    sweep = created["sweep"]
    typer.echo(
        f"sweep {sweep['id']}  {sweep['name']}: {sweep['n_runs']} runs (project {sweep['project']})"
    )
    for run in sweep["runs"]:
        typer.echo(f"  {run['id']}  {run['status']:9} {run['name']}")
    lines = learner_env_lines(created)
    if learner_env is None:
        typer.echo("learner credentials (shown once):")
        typer.echo("\n".join(lines))
        return
    try:
        _write_private(learner_env, "\n".join(lines) + "\n")
    except OSError as exc:
        typer.secho(f"cannot write {learner_env} ({exc}); here they are:", err=True)
        typer.echo("\n".join(lines))
        raise typer.Exit(1) from None
    typer.echo(f"learner credentials of {len(created['learners'])} runs: {learner_env} (0600)")


@sweep_app.command("list")
def list_sweeps(
    project: str = PROJECT_FILTER, server: str = SERVER, token: str = TOKEN, as_json: bool = AS_JSON
) -> None:
    """Sweeps, newest first: id, runs, runs by status, project, name."""
    sweeps = call(server, token, lambda c: c.list_sweeps(project=project))
    if as_json:
        typer.echo(json.dumps(sweeps, indent=2))
        return
    for s in sweeps:
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(s["statuses"].items()))
        typer.echo(f"{s['id']}  {s['n_runs']:>3} runs  [{statuses}]  {s['project']}  {s['name']}")


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _overrides(overrides: dict[str, Any]) -> str:
    shown = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
    return "\n".join(shown) or "(base)"


@sweep_app.command("show")
def show(
    sweep_id: str = SWEEP_ID, server: str = SERVER, token: str = TOKEN, as_json: bool = AS_JSON
) -> None:
    """A table of the sweep's runs: overrides, status, version (best), last reward, eval
    accuracy, stale waste and spend."""
    from rich.console import Console
    from rich.table import Table

    sweep = call(server, token, lambda c: c.get_sweep(sweep_id))
    if as_json:
        typer.echo(json.dumps(sweep, indent=2))
        return
    table = Table(title=f"sweep {sweep['name']} ({sweep['id']})")
    for column in ("#", "run", "overrides", "status", "version", "best", "last reward"):
        table.add_column(column, justify="right" if column in ("#", "version") else "left")
    for column in ("eval accuracy", "stale waste", "spend $"):
        table.add_column(column, justify="right")
    for r in sweep["runs"]:
        best = "—" if r["best_version"] is None else f"v{r['best_version']}"
        if r["best_value"] is not None:
            best += f" ({r['best_value']:.3g})"
        table.add_row(
            str(r["index"]),
            r["id"][:8],
            _overrides(r["overrides"]),
            r["status"],
            str(r["current_version"]),
            best,
            _num(r["last_reward"], ".3f"),
            _num(r["eval_accuracy"], ".1%"),
            _num(r["stale_waste"], ".1%"),
            _num(r["spent_usd"], ".2f"),
        )
    Console(width=max(120, Console().width)).print(table)


def _act(action: str, sweep_id: str, server: str, token: str, reason: str | None) -> None:
    result = call(server, token, lambda c: c.sweep_action(sweep_id, action, reason))
    for r in result["runs"]:
        outcome = "moved" if r["moved"] else f"left ({r['code']}: {r['detail']})"
        typer.echo(f"  {r['run_id']}  {r['status']:9} {outcome}  {r['name']}")
    typer.echo(f"{action}: {result['moved']} moved, {result['refused']} left as they were")


@sweep_app.command("pause")
def pause(
    sweep_id: str = SWEEP_ID, server: str = SERVER, token: str = TOKEN, reason: str = REASON
) -> None:
    """Pause every run of the sweep that is pending or running (the others are listed, as
    they were)."""
    _act("pause", sweep_id, server, token, reason)


@sweep_app.command("resume")
def resume(
    sweep_id: str = SWEEP_ID, server: str = SERVER, token: str = TOKEN, reason: str = REASON
) -> None:
    """Resume every paused (or budget_exhausted) run of the sweep; the others are listed."""
    _act("resume", sweep_id, server, token, reason)


@sweep_app.command("cancel")
def cancel(
    sweep_id: str = SWEEP_ID, server: str = SERVER, token: str = TOKEN, reason: str = REASON
) -> None:
    """Cancel every run of the sweep that has not ended; the ended ones are listed."""
    _act("cancel", sweep_id, server, token, reason)
