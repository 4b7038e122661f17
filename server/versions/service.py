"""The version long-poll's rules: which runs a worker is told about (its base models, the
projects it serves), and the watch of this server process (built from the app's database
access)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

from anyio import to_thread
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from protocol.schemas import INT_MAX, MAX_VERSIONS_AFTER, VersionNotice
from protocol.storage import ObjectStore
from server.config import Settings
from server.errors import Unprocessable
from server.leases.service import adapter_ref
from server.projects.fleet import serves_project
from server.versions import repository as repo
from server.versions.watch import RunVersion, VersionWatch

_HEX = "[0-9a-fA-F]"
_AFTER_ENTRY = re.compile(
    rf"(?P<run_id>{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}):(?P<version>[0-9]{{1,10}})"
)


def make_watch(state: Any) -> VersionWatch:
    """The watch of this process: its reads run in a session in a thread."""
    factory: sessionmaker[Session] = state.sessionmaker

    def in_session(read: Any, *args: Any) -> Any:
        with factory() as session:
            return read(session, *args)

    async def read_runs() -> list[repo.RunRow]:
        rows: list[repo.RunRow] = await to_thread.run_sync(in_session, repo.running_runs)
        return rows

    async def read_adapter(run_id: uuid.UUID, version: int) -> repo.Adapter | None:
        found: repo.Adapter | None = await to_thread.run_sync(
            in_session, repo.adapter, run_id, version
        )
        return found

    return VersionWatch(read_runs, read_adapter, state.settings.version_poll_s)


def poke_after_commit(app: FastAPI, session: Session) -> None:
    """Have this process's watch read again once the session's transaction commits (a publish:
    its workers hear of the new version at once rather than at the next tick)."""
    watch: VersionWatch = app.state.version_watch
    event.listen(session, "after_commit", lambda _session: watch.poke(), once=True)


def parse_after(after: list[str]) -> dict[uuid.UUID, int]:
    """`after` entries "<run_id>:<version>" as {run_id: version}; 422 naming `after`."""
    if len(after) > MAX_VERSIONS_AFTER:
        _refuse(f"at most {MAX_VERSIONS_AFTER} entries, got {len(after)}")
    named: dict[uuid.UUID, int] = {}
    for entry in after:
        run_id, version = _entry(entry)
        if run_id in named:
            _refuse(f"run {run_id} is named twice")
        named[run_id] = version
    return named


def _entry(entry: str) -> tuple[uuid.UUID, int]:
    # A pattern, not uuid.UUID() and int() alone: int() takes "+1", " 1", "1_0" and other
    # scripts' digits ("١"), uuid.UUID() braces and underscores.
    found = _AFTER_ENTRY.fullmatch(entry)
    version = int(found["version"]) if found else -1
    if found is None or version > INT_MAX:
        _refuse(
            f"{entry[:80]!r} is not '<run_id>:<version>' (a UUID, a colon and ASCII digits "
            f"0 … {INT_MAX})"
        )
    return uuid.UUID(found["run_id"]), version


def _refuse(message: str) -> NoReturn:
    raise Unprocessable(
        "invalid request",
        errors=[{"field": "after", "message": message, "type": "value_error"}],
        code="after_invalid",
    )


def newer(
    runs: Mapping[uuid.UUID, RunVersion],
    models: Collection[str],
    project_id: uuid.UUID | None,
    after: Mapping[uuid.UUID, int],
) -> dict[uuid.UUID, RunVersion]:
    """The runs of these base models, of a project a worker of `project_id` serves (None: the
    shared fleet, every project; server/projects/fleet.py), whose version is newer than
    `after` names (a run not named: newer than version 0)."""
    return {
        run_id: run
        for run_id, run in runs.items()
        if run.base_model in models
        and serves_project(project_id, run.project_id)
        and run.version > after.get(run_id, 0)
    }


def notices(
    store: ObjectStore, settings: Settings, runs: Mapping[uuid.UUID, RunVersion]
) -> list[VersionNotice]:
    """What the worker is told of each: the version and the adapter a lease of it carries."""
    return [
        VersionNotice(
            run_id=run_id,
            version=run.version,
            adapter=adapter_ref(store, settings, run_id, run.version, run.adapter),
        )
        for run_id, run in runs.items()
    ]
