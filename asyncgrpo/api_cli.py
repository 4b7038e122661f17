"""What the CLI's API commands share (project, run, sweep): the control plane's URL and an admin
token as options (and environment variables), and one call through the typed client
(protocol/client.py) whose error answer or unreachable server exits 2 with its words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import typer

SERVER = typer.Option(
    "http://127.0.0.1:8000", "--server", envvar="ASYNCGRPO_SERVER", help="Control plane URL."
)
TOKEN = typer.Option(..., "--token", envvar="ASYNCGRPO_ADMIN_TOKEN", help="An admin token.")
AS_JSON = typer.Option(
    False,
    "--json",
    help="Print the API's JSON answer instead of the lines or table for people.",
    show_default="lines or table",
)
PROJECT = typer.Option(
    None,
    "--project",
    help="A project's name or id (asyncgrpo project list); 422 unknown_project when none has it.",
    show_default="the default project",
)
PROJECT_FILTER = typer.Option(
    None,
    "--project",
    help="Only this project's (its name or id).",
    show_default="every project's",
)


def fail(message: str) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _invalid_fields(body: dict[str, Any]) -> str:
    """A validation failure's fields and reasons (`errors`), one per line."""
    errors = body.get("errors")
    if not isinstance(errors, list):
        return ""
    return "".join(
        f"\n  {e.get('field')}: {e.get('message')}" for e in errors if isinstance(e, dict)
    )


def call(server: str, token: str, action: Callable[[Any], Any]) -> Any:
    """`action(client)`, an error answer (its status, code, words and field) or an unreachable
    server exiting 2."""
    from protocol.client import TRANSIENT_ERRORS, ApiError, AsyncGrpoClient

    try:
        with AsyncGrpoClient(server, token, max_retries=2, retry_cap_s=2.0) as client:
            return action(client)
    except ApiError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        code = f" {exc.code}" if exc.code else ""
        field = f" (field: {body['field']})" if body.get("field") else ""
        fail(f"{exc.status_code}{code}: {exc.detail}{field}{_invalid_fields(body)}")
    except TRANSIENT_ERRORS as exc:
        fail(f"{server}: {type(exc).__name__} {exc}".strip())
