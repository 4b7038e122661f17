"""`asyncgrpo project create | list | rename` and `asyncgrpo project token create | list |
revoke`: the projects API (docs/guides/projects.md) through the typed client
(protocol/client.py), with an admin token (or, for a project's tokens, its owner's)."""

from __future__ import annotations

import json
from typing import Any

import typer

from asyncgrpo.api_cli import AS_JSON, SERVER, TOKEN, call, fail
from asyncgrpo.help_layout import App

project_app = App(
    help="Projects: each team's runs, sweeps and datasets on one control plane.",
    no_args_is_help=True,
)

NAME_RULE = "a lowercase slug: 1-63 characters of a-z, 0-9 and -, starting with a letter or digit"


@project_app.command("create")
def create(
    name: str = typer.Argument(..., help=f"The new project's name, {NAME_RULE}."),
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Create a project and print its id and name; a name in use exits 2 with 409
    project_name_taken, a name that breaks the rule with 422 naming `name`."""
    made = call(server, token, lambda c: c.create_project(name))
    if as_json:
        typer.echo(json.dumps(made, indent=2))
        return
    typer.echo(f"project {made['id']}  {made['name']}")


@project_app.command("list")
def list_projects(server: str = SERVER, token: str = TOKEN, as_json: bool = AS_JSON) -> None:
    """Every project, by name: its name, id, runs and creation time."""
    from rich.console import Console
    from rich.table import Table

    projects = call(server, token, lambda c: c.list_projects())
    if as_json:
        typer.echo(json.dumps(projects, indent=2))
        return
    table = Table(title="projects")
    for column in ("name", "id", "runs", "created"):
        table.add_column(column, justify="right" if column == "runs" else "left", no_wrap=True)
    for p in projects:
        table.add_row(p["name"], p["id"], str(p["runs"]), p["created_at"])
    Console(width=max(100, Console().width)).print(table)


@project_app.command("rename")
def rename(
    old: str = typer.Argument(..., help="The project to rename: its name or its id."),
    new: str = typer.Argument(..., help=f"Its new name, {NAME_RULE}."),
    server: str = SERVER,
    token: str = TOKEN,
) -> None:
    """Rename a project; its runs, sweeps and datasets keep it. An unknown project exits 2, a
    new name in use exits 2 with 409 project_name_taken."""

    renamed = call(server, token, lambda c: c.rename_project(_project_id(c, old), new))
    typer.echo(f"project {renamed['id']}  {old} -> {renamed['name']}")


def _project_id(client: Any, ref: str) -> str:
    """The id of the project named `ref` (its name or its id), or a CLI error."""
    listed = client.list_projects()
    # a name first, as the server's lookup does (a slug can look like an id)
    found = [p for p in listed if p["name"] == ref] + [p for p in listed if p["id"] == ref]
    if not found:
        fail(f"no project has the name or id {ref!r} (asyncgrpo project list)")
    return str(found[0]["id"])


token_app = App(
    help="A project's API tokens: each acts in the project only, as its role allows "
    "(owner, member, ci, viewer).",
    no_args_is_help=True,
)
project_app.add_typer(token_app, name="token")
PROJECT = typer.Argument(..., help="The project: its name or its id.")
ROLES = ("owner", "member", "ci", "viewer")


@token_app.command("create")
def token_create(
    project: str = PROJECT,
    role: str = typer.Option(..., help=f"What it may do: {', '.join(ROLES)}."),
    name: str = typer.Option(..., help="Who or what holds it, e.g. ci-main."),
    ttl_hours: float | None = typer.Option(None, help="Hours until it expires (default: never)."),
    server: str = SERVER,
    token: str = TOKEN,
    as_json: bool = AS_JSON,
) -> None:
    """Mint a project token of one role and print it (shown only now); an admin's or the
    project owner's call. A role not in the list exits 2 with 422 naming `role`."""
    made = call(
        server,
        token,
        lambda c: c.create_project_token(_project_id(c, project), name, role, ttl_hours),
    )
    if as_json:
        typer.echo(json.dumps(made, indent=2))
        return
    typer.echo(f"{made['token']}  ({made['role']} of {project}, id {made['id']})")


@token_app.command("list")
def token_list(
    project: str = PROJECT, server: str = SERVER, token: str = TOKEN, as_json: bool = AS_JSON
) -> None:
    """The project's tokens, newest first: id, prefix, name, role, expiry, revoked."""
    from rich.console import Console
    from rich.table import Table

    found = call(server, token, lambda c: c.list_project_tokens(_project_id(c, project)))
    if as_json:
        typer.echo(json.dumps(found, indent=2))
        return
    table = Table(title=f"tokens of {project}")
    columns = ("id", "prefix", "name", "role", "expires_at", "revoked_at")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for t in found:
        table.add_row(*(str(t[c] or "") for c in columns))
    Console(width=max(100, Console().width)).print(table)


@token_app.command("revoke")
def token_revoke(
    project: str = PROJECT,
    token_id: str = typer.Argument(..., help="The token's id (asyncgrpo project token list)."),
    server: str = SERVER,
    token: str = TOKEN,
) -> None:
    """Revoke one of the project's tokens (idempotent); its next call is a 401."""
    done = call(server, token, lambda c: c.revoke_project_token(_project_id(c, project), token_id))
    typer.echo(f"revoked {done['prefix']} ({done['role']}) at {done['revoked_at']}")
