"""Every refusal of the worker calls, as a table: the call, how to arrange it, and the answer.

The one lease engine (server/leases/service.py, fenced.py) runs the same code on Postgres and
SQLite, but a few of its statements are written twice, once per database
(server/leases/statements.py): the acquire's first statement, the grant, the heartbeat, the
accept. For each row, the same arrangement is made on two servers (tests/server/leases/twins.py),
one on a Postgres database and one on a SQLite file, with the same run and worker ids. The test
checks that each server answers what the table says (status, and the body's fields written
there), that the two answer exactly the same (status and whole body) and leave exactly the same
rows (tests/server/leases/rows.py: ids, times and the databases' representations of a value
normalised, nothing else), that each counted the call once in app.state.worker_calls (or not at
all, where the table says `counted=False`: the request was refused before the endpoint, by
request validation or for a missing bearer token), and, where the table says so, that nothing
changed.

No difference between the databases is known: a row that finds one fails.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import update

from protocol import layout
from protocol.error_codes import status_of
from server.config import SecuritySettings
from server.db_types import db_now, db_now_plus
from server.models import Lease, Run, Token, Worker
from tests.server.leases.helpers import batch_manifest
from tests.server.leases.lease_paths import POSTGRES, SQLITE
from tests.server.leases.twins import BASE, Outcome, Sent, Servers, Side, bearer, empty, send

pytestmark = pytest.mark.postgres

DATA = b"the batch bytes, the same on both databases"
FENCED_CALLS = ("heartbeat", "upload", "complete", "release")
MAX_BLOB_BYTES = SecuritySettings().max_blob_bytes


# -- arrangements: a held lease ----------------------------------------------------------------


Arrange = Callable[[Side], Sent]


def _held(side: Side, **config: Any) -> tuple[str, dict[str, Any]]:
    """A run and a worker (token) holding a lease on it."""
    side.run(**config)
    token = side.worker()
    return token, side.acquire(token)


def _natural_body(side: Side, call: str, lease: dict[str, Any]) -> dict[str, Any]:
    """What a worker holding the lease sends (its batch object is in the bucket for complete)."""
    if call == "upload":
        return {"size": len(DATA), "sha256": hashlib.sha256(DATA).hexdigest()}
    if call == "complete":
        side.app.state.store.put_bytes(lease["batch_key"], DATA)
        return {"manifest": batch_manifest(lease, DATA)}
    return {}


def _on_lease(call: str, lease: dict[str, Any], headers: dict[str, str], **body: Any) -> Sent:
    lease_id = lease["lease_id"]
    return Sent(f"{BASE}/{lease_id}/{call}", {"fencing": lease["fencing"], **body}, headers)


# -- what a row expects ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """The status; fields the JSON body must have (or the whole text of another body; None: no
    body); whether the call is counted in worker_calls (False: refused before the endpoint, see
    the module docstring); whether every row must stay as it was."""

    status: int
    fields: dict[str, Any] | str | None
    counted: bool = True
    changes_nothing: bool = True


def refused(status: int, detail: str, code: str, counted: bool = True, **more: Any) -> Answer:
    """A refusal: its status, message and error code (the code's status is the table's)."""
    assert status_of(code) == status
    return Answer(status, {"detail": detail, "code": code, **more}, counted)


def changed(status: int, **fields: Any) -> Answer:
    """Answered `status` with these fields, and rows written (an abort, a rejected batch…)."""
    return Answer(status, fields, changes_nothing=False)


NOT_FOUND = refused(404, "lease not found", "lease_not_found")
LOST = refused(
    409,
    "lease lost: fencing token, state or expiry no longer holds; drop the work",
    "fencing_lost",
)
WRONG_KEY = refused(
    422, "manifest.key is not this lease's batch key", "wrong_batch_key", field="manifest.key"
)
INVALID_REQUEST = Answer(
    422, {"detail": "invalid request", "code": "validation_failed"}, counted=False
)
INACTIVE_WORKER = Answer(204, None)
NOTHING_TO_GRANT = Answer(204, None, changes_nothing=False)  # the worker is seen
UNREGISTERED_MODEL = refused(
    409,
    "this worker asks for leases of 'another-model' (--model) but registered with "
    "['tiny-model']: run it with that model, or register it again (remove its token file and "
    "give a registration token)",
    "model_not_registered",
)


# -- arrangements: credentials ----------------------------------------------------------------


Credentials = Callable[[Side, str], dict[str, str]]  # (side, the worker's token) -> headers


def _no_header(side: Side, token: str) -> dict[str, str]:
    return {}


def _not_a_token(side: Side, token: str) -> dict[str, str]:
    return bearer("not-an-asyncgrpo-token")  # no token prefix: refused before any query


def _unknown_token(side: Side, token: str) -> dict[str, str]:
    return bearer("agr_wkr_" + "A" * 43)


def _revoke_token(side: Side, token: str) -> dict[str, str]:
    side.execute(update(Token).where(Token.kind == "worker").values(revoked_at=db_now()))
    return bearer(token)


def _expire_token(side: Side, token: str) -> dict[str, str]:
    side.execute(update(Token).where(Token.kind == "worker").values(expires_at=db_now_plus(-1)))
    return bearer(token)


def _revoke_worker(side: Side, token: str) -> dict[str, str]:
    side.execute(update(Worker).values(status="revoked"))  # its token still live
    return bearer(token)


def _token_of_no_worker(side: Side, token: str) -> dict[str, str]:
    return bearer(side.token("worker", scope_id=side.fixed_id("a worker never registered")))


def _token_of(kind: str) -> Credentials:
    scope = {"learner": "run"}.get(kind)
    return lambda side, token: bearer(side.token(kind, scope_id=scope and side.fixed_id(scope)))


def _wrong_kind(kind: str) -> tuple[Credentials, Answer]:
    return _token_of(kind), refused(
        403, f"a {kind} token cannot call this endpoint", "token_kind_forbidden"
    )


CREDENTIALS: dict[str, tuple[Credentials, Answer]] = {
    "no-bearer-token": (
        _no_header,
        refused(401, "missing bearer token", "token_missing", counted=False),
    ),
    "not-a-token": (_not_a_token, refused(401, "invalid token", "token_invalid")),
    "unknown-token": (_unknown_token, refused(401, "invalid token", "token_invalid")),
    "revoked-token": (_revoke_token, refused(401, "token revoked", "token_revoked")),
    "expired-token": (_expire_token, refused(401, "token expired", "token_expired")),
    "admin-token": _wrong_kind("admin"),
    "learner-token": _wrong_kind("learner"),
    "registration-token": _wrong_kind("registration"),
    "revoked-worker": (_revoke_worker, refused(401, "worker revoked", "worker_revoked")),
    "token-of-no-worker": (_token_of_no_worker, refused(401, "worker revoked", "worker_revoked")),
}


def _credentials(call: str, credentials: Credentials) -> Arrange:
    def arrange(side: Side) -> Sent:
        if call == "acquire":
            side.run()
            return Sent(f"{BASE}/acquire", {}, credentials(side, side.worker()))
        token, lease = _held(side)
        body = _natural_body(side, call, lease)
        return _on_lease(call, lease, credentials(side, token), **body)

    return arrange


# -- arrangements: the lease is not (or no longer) the caller's to use -------------------------


Held = tuple[str, dict[str, Any]]  # the caller's token, the lease as the call names it


def _lost_fencing(side: Side, token: str, lease: dict[str, Any]) -> Held:
    return token, {**lease, "fencing": lease["fencing"] + 1}


def _expired(side: Side, token: str, lease: dict[str, Any]) -> Held:
    lease_id = uuid.UUID(lease["lease_id"])
    side.execute(update(Lease).where(Lease.id == lease_id).values(expires_at=db_now_plus(-1)))
    return token, lease


def _swept(side: Side, token: str, lease: dict[str, Any]) -> Held:
    _expired(side, token, lease)
    side.sweep()  # state `expired`, its rows re-queued
    return token, lease


def _completed(side: Side, token: str, lease: dict[str, Any]) -> Held:
    side.app.state.store.put_bytes(lease["batch_key"], DATA)
    done = side.call("complete", lease, token, manifest=batch_manifest(lease, DATA))
    assert done.json()["state"] == "accepted", done.text
    return token, lease


def _released(side: Side, token: str, lease: dict[str, Any]) -> Held:
    assert side.call("release", lease, token).status_code == 200
    return token, lease


def _aborted(side: Side, token: str, lease: dict[str, Any]) -> Held:
    side.execute(update(Run).values(current_version=2))  # past max_staleness 1
    assert side.call("heartbeat", lease, token).json()["reason"] == "stale"
    return token, lease


def _another_workers(side: Side, token: str, lease: dict[str, Any]) -> Held:
    return side.worker("stranger"), lease


def _unknown(side: Side, token: str, lease: dict[str, Any]) -> Held:
    return token, {**lease, "lease_id": str(side.fixed_id("no such lease"))}


LeaseCondition = Callable[[Side, str, dict[str, Any]], Held]

LEASE_CONDITIONS: dict[str, tuple[LeaseCondition, Answer]] = {
    "lost-fencing": (_lost_fencing, LOST),
    "expired-lease": (_expired, LOST),
    "swept-lease": (_swept, LOST),
    "completed-lease": (_completed, LOST),
    "released-lease": (_released, LOST),
    "aborted-lease": (_aborted, LOST),
    "another-workers-lease": (_another_workers, NOT_FOUND),
    "unknown-lease": (_unknown, NOT_FOUND),
}


def _lease_condition(call: str, condition: LeaseCondition) -> Arrange:
    def arrange(side: Side) -> Sent:
        token, lease = _held(side)
        body = _natural_body(side, call, lease)
        token, lease = condition(side, token, lease)
        return _on_lease(call, lease, bearer(token), **body)

    return arrange


# -- arrangements: one call's own refusals -----------------------------------------------------


def _acquire(body: dict[str, Any] | None = None, **worker: Any) -> Arrange:
    """A running run and a worker (made with these fields) asking for a lease."""

    def arrange(side: Side) -> Sent:
        side.run()
        return Sent(f"{BASE}/acquire", body or {}, bearer(side.worker(**worker)))

    return arrange


def _acquire_after(prepare: Callable[[Side], str]) -> Arrange:
    """The worker that `prepare` arranged (its token) asks for a lease."""
    return lambda side: Sent(f"{BASE}/acquire", {}, bearer(prepare(side)))


def _at_the_bound(side: Side) -> str:
    side.run(n_rows=20)  # bound (1 + 1) × 1 × 4 = 8 groups, 2 per lease: 4 leases
    token = side.worker()
    for _ in range(4):
        side.acquire(token)
    return token


def _with_an_empty_queue(side: Side) -> str:
    side.run(n_rows=2)
    token = side.worker()
    side.acquire(token)  # both rows
    return token


def _with_a_paused_run(side: Side) -> str:
    side.run(status="paused")
    return side.worker()


def _with_an_expired_lease(side: Side) -> str:
    token, lease = _held(side)
    _expired(side, token, lease)
    return token


def _with_a_version_without_its_adapter(side: Side) -> str:
    side.run()
    side.execute(update(Run).values(current_version=1))  # no adapter_versions row for it
    return side.worker()


def _heartbeat(change: Callable[[Side], None], *, fencing_lost: bool = False) -> Arrange:
    """A held lease, then `change` (to the run or the lease) before it beats."""

    def arrange(side: Side) -> Sent:
        token, lease = _held(side, max_staleness=1)
        change(side)
        fencing = lease["fencing"] + int(fencing_lost)
        return _on_lease("heartbeat", {**lease, "fencing": fencing}, bearer(token))

    return arrange


def _run(**values: Any) -> Callable[[Side], None]:
    return lambda side: side.execute(update(Run).values(**values))


def _paused_and_expired(side: Side) -> None:
    side.execute(update(Run).values(status="paused"))
    side.execute(update(Lease).values(expires_at=db_now_plus(-1)))


def _quarantined_worker(call: str) -> Arrange:
    """A worker quarantined while it holds a lease still finishes it (it gets no new one)."""

    def arrange(side: Side) -> Sent:
        token, lease = _held(side)
        body = _natural_body(side, call, lease)
        side.execute(update(Worker).values(status="quarantined", quarantine_reason="spot check"))
        return _on_lease(call, lease, bearer(token), **body)

    return arrange


def _oversized_upload(*, by_the_holder: bool) -> Arrange:
    def arrange(side: Side) -> Sent:
        token, lease = _held(side)
        caller = token if by_the_holder else side.worker("stranger")
        body = {"size": MAX_BLOB_BYTES + 1, "sha256": "0" * 64}
        return _on_lease("upload", lease, bearer(caller), **body)

    return arrange


def _complete(*, put: bytes | None, fencing_lost: bool = False, **manifest: Any) -> Arrange:
    """Complete a held lease with `put` in the bucket at its batch key (None: nothing there)
    and the manifest of DATA with these fields changed."""

    def arrange(side: Side) -> Sent:
        token, lease = _held(side)
        if put is not None:
            side.app.state.store.put_bytes(lease["batch_key"], put)
        named = {**lease, "fencing": lease["fencing"] + int(fencing_lost)}
        sent_manifest = batch_manifest(lease, DATA, **manifest)
        return _on_lease("complete", named, bearer(token), manifest=sent_manifest)

    return arrange


def _complete_naming_another_key(*, fencing_lost: bool) -> Arrange:
    def arrange(side: Side) -> Sent:
        other = layout.adapter_key(side.fixed_id("run"), 1, "adapter_model.safetensors")
        return _complete(put=DATA, fencing_lost=fencing_lost, key=other)(side)

    return arrange


def _invalid_body(call: str, **change: Any) -> Arrange:
    """What a lease holder would send, with these body fields changed (None: left out)."""

    def arrange(side: Side) -> Sent:
        if call == "acquire":
            sent = _acquire()(side)
        else:
            token, lease = _held(side)
            sent = _on_lease(call, lease, bearer(token), **_natural_body(side, call, lease))
        body = {k: v for k, v in {**sent.body, **change}.items() if v is not None}
        return Sent(sent.path, body, sent.headers)

    return arrange


def _not_a_lease_id(side: Side) -> Sent:
    token, lease = _held(side)
    return Sent(f"{BASE}/not-a-uuid/heartbeat", {"fencing": lease["fencing"]}, bearer(token))


# -- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    name: str  # starts with the call
    arrange: Arrange
    expected: Answer
    marks: tuple[pytest.MarkDecorator, ...] = ()

    @property
    def call(self) -> str:
        return self.name.split("-", 1)[0]


CALL_SPECIFIC: list[tuple[str, Arrange, Answer]] = [
    # acquire: no lease
    ("acquire-quarantined-worker", _acquire(status="quarantined"), INACTIVE_WORKER),
    ("acquire-admission-bound-reached", _acquire_after(_at_the_bound), NOTHING_TO_GRANT),
    ("acquire-queue-empty", _acquire_after(_with_an_empty_queue), NOTHING_TO_GRANT),
    ("acquire-run-paused", _acquire_after(_with_a_paused_run), NOTHING_TO_GRANT),
    ("acquire-unserved-model", _acquire(models=["another-model"]), NOTHING_TO_GRANT),
    ("acquire-models-narrowed-to-none", _acquire({"models": []}), NOTHING_TO_GRANT),
    ("acquire-unregistered-model", _acquire({"models": ["another-model"]}), UNREGISTERED_MODEL),
    # acquire: granted, but the expired lease is first swept (its rows re-granted), in a unit
    # of its own before the grant
    ("acquire-sweeps-an-expired-lease", _acquire_after(_with_an_expired_lease),
     changed(200, fencing=2, adapter_version=0)),
    # heartbeat: abort (the lease ends `aborted`, its rows are re-queued)
    ("heartbeat-stale-lease", _heartbeat(_run(current_version=2)),
     changed(200, abort=True, reason="stale", current_version=2, ttl_s=0.0)),
    *(
        (f"heartbeat-run-{status}", _heartbeat(_run(status=status)),
         changed(200, abort=True, reason=f"run_{status}", ttl_s=0.0))
        for status in ("paused", "cancelled", "failed")
    ),
    ("heartbeat-stale-lease-lost-fencing", _heartbeat(_run(current_version=2), fencing_lost=True),
     LOST),
    ("heartbeat-paused-run-expired-lease", _heartbeat(_paused_and_expired), LOST),
    # upload
    ("upload-oversized", _oversized_upload(by_the_holder=True),
     refused(413, f"size exceeds {MAX_BLOB_BYTES} bytes", "upload_too_large", field="size")),
    ("upload-oversized-another-workers-lease", _oversized_upload(by_the_holder=False), NOT_FOUND),
    # complete: 422 (nothing changed), or the batch rejected (the lease ends `completed`, its
    # rows are re-queued)
    ("complete-another-key", _complete_naming_another_key(fencing_lost=False), WRONG_KEY),
    ("complete-another-key-lost-fencing", _complete_naming_another_key(fencing_lost=True),
     WRONG_KEY),
    ("complete-missing-object", _complete(put=None),
     changed(200, state="rejected", reject_reason="missing_object")),
    ("complete-wrong-size", _complete(put=b"short"),
     changed(200, state="rejected", reject_reason="size_mismatch")),
    ("complete-wrong-sample-count", _complete(put=DATA, n_samples=3),
     changed(200, state="rejected", reject_reason="invalid")),
    ("complete-missing-object-lost-fencing", _complete(put=None, fencing_lost=True), LOST),
    # a quarantined worker finishes the lease it holds (it gets no new one): not refused
    ("heartbeat-quarantined-worker", _quarantined_worker("heartbeat"),
     changed(200, abort=False, ttl_s=60.0)),
    ("upload-quarantined-worker", _quarantined_worker("upload"), changed(200, expires_in_s=900)),
    ("complete-quarantined-worker", _quarantined_worker("complete"),
     changed(200, state="accepted")),
    # request validation: refused before the endpoint
    *(
        (f"{call}-unknown-field", _invalid_body(call, surprise=1), INVALID_REQUEST)
        for call in ("acquire", *FENCED_CALLS)
    ),
    ("acquire-nul-in-text", _invalid_body("acquire", models=["a\u0000"]), INVALID_REQUEST),
    ("acquire-negative-wait", _invalid_body("acquire", wait_s=-1), INVALID_REQUEST),
    ("heartbeat-not-a-lease-id", _not_a_lease_id, INVALID_REQUEST),
    ("heartbeat-no-fencing", _invalid_body("heartbeat", fencing=None), INVALID_REQUEST),
    ("heartbeat-negative-fencing", _invalid_body("heartbeat", fencing=-1), INVALID_REQUEST),
    ("upload-empty", _invalid_body("upload", size=0), INVALID_REQUEST),
    ("upload-not-a-sha256", _invalid_body("upload", sha256="xyz"), INVALID_REQUEST),
    ("complete-no-manifest", _invalid_body("complete", manifest=None), INVALID_REQUEST),
]  # fmt: skip


# A run at a version with no adapter_versions row (a broken database: versions are published
# with their row) has nothing a lease could carry: no grant on either database, nothing changed.
UNPUBLISHED_VERSION = Refusal(
    "acquire-version-without-its-adapter-row",
    _acquire_after(_with_a_version_without_its_adapter),
    NOTHING_TO_GRANT,
)


def _table() -> list[Refusal]:
    rows = [
        Refusal(f"{call}-{name}", _credentials(call, credentials), answer)
        for call in ("acquire", *FENCED_CALLS)
        for name, (credentials, answer) in CREDENTIALS.items()
    ]
    rows += [
        Refusal(f"{call}-{name}", _lease_condition(call, condition), answer)
        for call in FENCED_CALLS
        for name, (condition, answer) in LEASE_CONDITIONS.items()
    ]
    return rows + [Refusal(*row) for row in CALL_SPECIFIC] + [UNPUBLISHED_VERSION]


TABLE = _table()


# -- the test ----------------------------------------------------------------------------------


def _outcome(side: Side, refusal: Refusal) -> Outcome:
    empty(side.app)
    return send(side, refusal.arrange(side))


def _has(body: Any, fields: dict[str, Any] | str | None) -> bool:
    if not isinstance(fields, dict):
        return body == fields
    return isinstance(body, dict) and all(body.get(k) == v for k, v in fields.items())


def _counted(refusal: Refusal) -> Counter[str]:
    """worker_calls after the row's one call: the call once, or nothing for a request refused
    before the endpoint."""
    return Counter({refusal.call: 1}) if refusal.expected.counted else Counter()


@pytest.mark.parametrize("refusal", [pytest.param(r, id=r.name, marks=r.marks) for r in TABLE])
def test_postgres_and_sqlite_refuse_alike(servers: Servers, refusal: Refusal) -> None:
    namespace = uuid.uuid4()  # the run's and workers' ids, the same on both servers
    outcome = {
        database: _outcome(Side(app, client, namespace), refusal)
        for database, (app, client) in servers.items()
    }
    postgres, sqlite = outcome[POSTGRES], outcome[SQLITE]
    expected = refusal.expected

    for database, answered in outcome.items():
        assert answered.status == expected.status, (database, answered.body)
        assert _has(answered.body, expected.fields), (database, answered.body)
        assert answered.calls == _counted(refusal), database
        if expected.changes_nothing:
            assert not answered.changed, database
    assert (sqlite.status, sqlite.body) == (postgres.status, postgres.body)
    assert sqlite.rows == postgres.rows
