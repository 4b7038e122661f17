"""`asyncgrpo datasets upload FILE` and `asyncgrpo datasets list`: the datasets API over HTTP
with an admin token (a progress bar while the file streams)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from asyncgrpo.api_cli import PROJECT_FILTER
from asyncgrpo.help_layout import App

datasets_app = App(help="Stored datasets (JSONL or Parquet files).", no_args_is_help=True)

SERVER = typer.Option(
    "http://127.0.0.1:8000", "--server", envvar="ASYNCGRPO_SERVER", help="Control plane URL."
)
TOKEN = typer.Option(..., "--token", envvar="ASYNCGRPO_ADMIN_TOKEN", help="An admin token.")
FILE = typer.Argument(..., exists=True, dir_okay=False, help="A .jsonl or .parquet file.")
CHUNK = 1024 * 1024


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _detail(response: Any) -> str:
    """The error answer's words, then its code and field when it has them."""
    try:
        body = response.json()
    except ValueError:
        return str(response.text)
    if not isinstance(body, dict):
        return str(response.text)
    named = [f"{k}: {body[k]}" for k in ("code", "field") if body.get(k)]
    return str(body.get("detail", response.text)) + (f" ({', '.join(named)})" if named else "")


def _chunks(path: Path, advance: Any) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            advance(len(block))
            yield block


@datasets_app.command("upload")
def upload(
    file: Path = FILE,
    server: str = SERVER,
    token: str = TOKEN,
    fmt: str = typer.Option(None, "--format", help="jsonl or parquet (default: the suffix)."),
    project: str = typer.Option(
        None,
        "--project",
        help="The project (name or id) it is uploaded to: only that project's runs may read "
        "it. 422 unknown_project when none has it.",
        show_default="the default project",
    ),
) -> None:
    """Upload a dataset file into a project; prints the dataset (pending until the server has
    checked it)."""
    import httpx
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    params = {"name": file.name, **({"format": fmt} if fmt else {})}
    if project:
        params["project"] = project
    size = file.stat().st_size
    headers = {"Authorization": f"Bearer {token}", "Content-Length": str(size)}
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("upload", total=size)
        body = _chunks(file, lambda n: progress.advance(task, n))
        try:
            response = httpx.post(
                f"{server.rstrip('/')}/api/v1/datasets",
                params=params,
                content=body,
                headers=headers,
                timeout=httpx.Timeout(60.0, read=600.0),
            )
        except httpx.HTTPError as exc:
            _fail(f"{server}: {exc}")
    if response.status_code != 202:
        _fail(f"{response.status_code}: {_detail(response)}")
    dataset = response.json()
    typer.echo(
        f"{dataset['id']}  {dataset['status']}  {dataset['row_count']} rows  "
        f"columns: {', '.join(dataset['columns'] or [])}  project: {dataset['project']}"
    )
    typer.echo(f'use it in a run: "dataset": {{"kind": "uploaded", "id": "{dataset["id"]}"}}')


@datasets_app.command("list")
def list_datasets(server: str = SERVER, token: str = TOKEN, project: str = PROJECT_FILTER) -> None:
    """Datasets: id, kind, status, rows, project, name, columns (and why a failed one
    failed)."""
    import httpx

    try:
        response = httpx.get(
            f"{server.rstrip('/')}/api/v1/datasets",
            params={"project": project} if project else None,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
        )
    except httpx.HTTPError as exc:
        _fail(f"{server}: {exc}")
    if response.status_code != 200:
        _fail(f"{response.status_code}: {_detail(response)}")
    for d in response.json():
        rows = "?" if d["row_count"] is None else d["row_count"]
        line = (
            f"{d['id']}  {d['kind']:8} {d['status']:7} {rows:>9} rows  {d['project']}  {d['name']}"
        )
        columns = ", ".join(d["columns"] or [])
        typer.echo(line + (f"  [{columns}]" if columns else ""))
        if d["reason"]:
            typer.echo(f"    failed: {d['reason']}")
