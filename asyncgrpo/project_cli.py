"""`asyncgrpo project create | list | rename`: the projects API (docs/guides/projects.md)
through the typed client (protocol/client.py) with an admin token."""

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

    def rename_it(client: Any) -> dict[str, Any]:
        listed = client.list_projects()
        # a name first, as the server's lookup does (a slug can look like an id)
        found = [p for p in listed if p["name"] == old] + [p for p in listed if p["id"] == old]
        if not found:
            fail(f"no project has the name or id {old!r} (asyncgrpo project list)")
        return dict(client.rename_project(found[0]["id"], new))

    renamed = call(server, token, rename_it)
    typer.echo(f"project {renamed['id']}  {old} -> {renamed['name']}")
