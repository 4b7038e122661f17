"""`asyncgrpo audit list`: the audit log (docs/guides/audit.md) through the typed client
(protocol/client.py) with an admin token: a table, or the API's JSON with --json."""

from __future__ import annotations

import json
from typing import Any

import typer

from asyncgrpo.api_cli import AS_JSON, SERVER, TOKEN, call
from asyncgrpo.help_layout import App

audit_app = App(help="The audit log: who changed what, when, from where.", no_args_is_help=True)

COLUMNS = ("at", "action", "outcome", "role", "token_name", "object", "project_id", "source")


def _option(help_text: str) -> Any:
    return typer.Option(None, help=help_text, show_default="any")


@audit_app.command("list")
def list_entries(
    server: str = SERVER,
    token: str = TOKEN,
    action: str | None = _option("Only this action, e.g. run.create."),
    project_id: str | None = _option("Only entries of this project (its id)."),
    token_id: str | None = _option("Only this token's calls (its id)."),
    object_type: str | None = _option("Only this kind of object: run, sweep, token, ..."),
    object_id: str | None = _option("Only this object (its id)."),
    outcome: str | None = _option("ok, unauthorized, forbidden or suppressed."),
    since: str | None = _option("Entries at or after this time (ISO 8601)."),
    until: str | None = _option("Entries before this time (ISO 8601)."),
    limit: int = typer.Option(50, min=1, max=500, help="Entries to show."),
    cursor: int | None = typer.Option(
        None,
        help="Start after this entry: the `next` a previous listing printed.",
        show_default="newest",
    ),
    as_json: bool = AS_JSON,
) -> None:
    """Audit entries, newest first."""
    filters = {
        "action": action, "project_id": project_id, "token_id": token_id,
        "object_type": object_type, "object_id": object_id, "outcome": outcome,
        "since": since, "until": until,
    }  # fmt: skip
    page = call(server, token, lambda c: c.list_audit(limit=limit, cursor=cursor, **filters))
    if as_json:
        typer.echo(json.dumps(page, indent=2))
        return
    _print(page)


def _cell(entry: dict[str, Any], column: str) -> str:
    if column == "object":
        kind, ident = entry.get("object_type"), entry.get("object_id")
        return f"{kind} {ident}" if ident else (kind or "")
    if column == "outcome" and entry.get("count", 1) > 1:
        return f"{entry['outcome']} ×{entry['count']}"
    value = entry.get(column)
    return "" if value is None else str(value)


def _print(page: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*COLUMNS)
    for entry in page["entries"]:
        table.add_row(*(_cell(entry, c) for c in COLUMNS))
    console = Console(width=200)
    console.print(table)
    if page.get("next_cursor") is not None:
        console.print(f"next: --cursor {page['next_cursor']}")
