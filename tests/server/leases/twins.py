"""Two servers running the one lease engine, one on a Postgres database (a clone of the migrated
template) and one on a SQLite file: the same arrangement on both (`Side`, with the same run and
worker ids), then the same request: what each answered, which worker calls it counted
(app.state.worker_calls), and the rows before and after, made comparable
(tests/server/leases/rows.py). Where the engine's SQL differs between the databases
(server/leases/statements.py), this is what shows that both forms follow one rule. Their clients
see a server error as a client would (a 500 answer), so that it compares too."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from server.leases import expiry
from server.tokens import service as tokens
from tests.conftest import cloned_database, empty_database, make_settings
from tests.server.leases.helpers import bearer, make_run, make_worker
from tests.server.leases.lease_paths import POSTGRES, SQLITE
from tests.server.leases.rows import id_labels, normalised_answer, normalised_rows, table_rows

BASE = "/api/v1/leases"
Servers = dict[str, tuple[FastAPI, TestClient]]  # POSTGRES or SQLITE -> (app, client)


@contextmanager
def twin_servers(pg_admin: Engine, pg_template: str, root: Path) -> Iterator[Servers]:
    """The Postgres server and the SQLite one, each on a fresh database of its own."""
    from server.app import create_app

    made: Servers = {}
    with ExitStack() as stack:
        for database in (POSTGRES, SQLITE):
            if database == POSTGRES:
                url = stack.enter_context(cloned_database(pg_admin, pg_template))
            else:
                url = f"sqlite:///{root / 'twin.db'}"
            settings = make_settings(url, root / f"bucket-{database}")
            app = create_app(settings, migrate=True)
            stack.callback(app.state.engine.dispose)
            client = TestClient(app, raise_server_exceptions=False)
            made[database] = (app, stack.enter_context(client))
        yield made


def empty(app: FastAPI) -> None:
    """The server's database as freshly migrated: every row deleted and, on Postgres, every id
    sequence restarted (SQLite's integer keys, without AUTOINCREMENT, start again at 1 in an
    empty table), so that serial ids agree across the twins."""
    engine = app.state.engine
    if engine.dialect.name == "postgresql":
        empty_database(engine)
        return
    import server.models  # noqa: F401 - every table on Base.metadata
    from server.models.base import Base
    from tests.conftest import delete_as_migrated

    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete_as_migrated(table))


@dataclass
class Side:
    """One of the two servers. Both sides get the same arrangement, with the same run and
    worker ids (derived from `namespace`), so that what they answer and write compares."""

    app: FastAPI
    client: TestClient
    namespace: uuid.UUID

    def fixed_id(self, name: str) -> uuid.UUID:
        return uuid.uuid5(self.namespace, name)

    def run(self, *, status: str = "running", **config: Any) -> uuid.UUID:
        run_id = self.fixed_id("run")
        with self.app.state.sessionmaker() as db:
            make_run(db, status=status, run_id=run_id, name="run", **{"n_rows": 6, **config})
            db.commit()
        return run_id

    def worker(self, name: str = "worker", **kw: Any) -> str:
        with self.app.state.sessionmaker() as db:
            _, token = make_worker(db, name=name, worker_id=self.fixed_id(name), **kw)
            db.commit()
        return token

    def token(self, kind: str, scope_id: uuid.UUID | None = None) -> str:
        with self.app.state.sessionmaker() as db:
            plaintext = tokens.mint(db, kind, name=kind, scope_id=scope_id).plaintext
            db.commit()
        return plaintext

    def execute(self, statement: Any) -> None:
        with self.app.state.sessionmaker() as db:
            db.execute(statement)
            db.commit()

    def sweep(self) -> None:
        with self.app.state.sessionmaker() as db:
            assert expiry.sweep_expired(db) == 1
            db.commit()

    def post(self, path: str, body: dict[str, Any], token: str) -> Any:
        return self.client.post(path, json=body, headers=bearer(token))

    def acquire(self, token: str) -> dict[str, Any]:
        answer = self.post(f"{BASE}/acquire", {}, token)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def call(self, call: str, lease: dict[str, Any], token: str, **body: Any) -> Any:
        body = {"fencing": lease["fencing"], **body}
        return self.post(f"{BASE}/{lease['lease_id']}/{call}", body, token)


@dataclass(frozen=True)
class Sent:
    """A request to send to a server."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Outcome:
    """What one request did: its status, its answer as sent (`raw`: the JSON, the text of any
    other body, None for none) and made comparable (`body`), the worker calls it added to
    app.state.worker_calls, the rows after it made comparable, and whether any row changed."""

    status: int
    raw: Any
    body: Any
    calls: Counter[str]
    rows: dict[str, list[Any]]
    changed: bool


def send(side: Side, sent: Sent) -> Outcome:
    with side.app.state.sessionmaker() as db:
        before = table_rows(db)
    counted_before = Counter(side.app.state.worker_calls)
    answer = side.client.post(sent.path, json=sent.body, headers=sent.headers)
    calls = Counter(side.app.state.worker_calls)
    calls.subtract(counted_before)
    with side.app.state.sessionmaker() as db:
        after = table_rows(db)
    raw = _content(answer)
    return Outcome(
        status=answer.status_code,
        raw=raw,
        body=normalised_answer(raw, id_labels(after)),
        calls=+calls,
        rows=normalised_rows(after, before),
        changed=after != before,
    )


def _content(answer: Any) -> Any:
    if not answer.content:
        return None
    if answer.headers.get("content-type") == "application/json":
        return answer.json()
    return answer.text
