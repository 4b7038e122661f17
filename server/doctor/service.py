"""The rules of the host checks: the calling token as it is seen, a run's model, and bucket
probes. A probe is bounded by construction: its PUT URL is signed for 32 bytes the server
chooses (an HMAC of the probe id under the server's secret, so no state is kept), for no
overwrite and for `PROBE_TTL_S`; checking it deletes it, and retention sweeps the ones left
behind (`sweep_probes`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import Callable

from sqlalchemy.orm import Session

from protocol import layout
from protocol.error_codes import ErrorCode
from protocol.requirements import release
from protocol.schemas_doctor import BucketProbe, BucketProbeChecked, ProbePut, RunModel, TokenCheck
from protocol.storage import ObjectNotFound, ObjectStore
from server.errors import NotFound
from server.models import Run, Token, Worker
from server.projects.fleet import serves_project

PROBE_BYTES = 32
PROBE_TTL_S = 120
# A probe object nobody checked (the host stopped between its PUT and the check) goes with
# the first retention pass after this age.
PROBE_SWEEP_AGE_S = 600.0


def token_check(bearer: Token) -> TokenCheck:
    """What the bearer may know of its own token (never another token's); its expiry is shown,
    not judged (the authentication did that: server/tokens/repository.py)."""
    kind = bearer.kind
    return TokenCheck(
        kind=kind,  # type: ignore[arg-type]
        prefix=bearer.prefix,
        name=bearer.name,
        expires_at=bearer.expires_at,
        run_id=bearer.scope_id if kind == "learner" else None,
        worker_id=bearer.scope_id if kind == "worker" else None,
        pool_learner_id=bearer.scope_id if kind == "pool_learner" else None,
        uses=bearer.uses if kind == "registration" else None,
        max_uses=bearer.max_uses if kind == "registration" else None,
        server_version=release(),
    )


def run_model(session: Session, token: Token, run_id: uuid.UUID) -> RunModel:
    """The run's model; a learner token sees only its own run, a pool learner's only the runs
    it holds, a project's worker or registration token only its project's runs (others look
    absent)."""
    run = session.get(Run, run_id)
    if run is None or _hidden(session, token, run):
        raise NotFound("run not found", code=ErrorCode.run_not_found)
    return RunModel(
        run_id=run.id,
        status=run.status,
        base_model=run.base_model,
        tokenizer_fingerprint=run.tokenizer_fingerprint,
    )


def _hidden(session: Session, token: Token, run: Run) -> bool:
    """Whether the run is out of the bearer's reach (an admin's: never)."""
    out_of_reach = _OUT_OF_REACH.get(token.kind)
    return out_of_reach is not None and out_of_reach(session, token, run)


def _worker_out_of_reach(session: Session, token: Token, run: Run) -> bool:
    worker = session.get(Worker, token.scope_id)
    return worker is None or not serves_project(worker.project_id, run.project_id)


# By token kind: a learner's own run, a pool learner's held runs, the runs of the projects a
# worker or a registration token serves (server/projects/fleet.py).
_OUT_OF_REACH: dict[str, Callable[[Session, Token, Run], bool]] = {
    "learner": lambda _session, token, run: token.scope_id != run.id,
    "pool_learner": lambda _session, token, run: run.pool_learner_id != token.scope_id,
    "worker": _worker_out_of_reach,
    "registration": lambda _session, token, run: (
        not serves_project(token.project_id, run.project_id)
    ),
}


def _content(secret: str, probe_id: str) -> bytes:
    return hmac.new(secret.encode(), b"bucket-probe:" + probe_id.encode(), hashlib.sha256).digest()


def new_probe(store: ObjectStore, secret: str) -> BucketProbe:
    probe_id = f"{int(time.time() * 1000):013d}-{secrets.token_hex(16)}"
    key = layout.probe_key(probe_id)
    content = _content(secret, probe_id)[:PROBE_BYTES]
    put = store.presign_put(
        key,
        size=len(content),
        sha256_hex=hashlib.sha256(content).hexdigest(),
        ttl_s=PROBE_TTL_S,
        if_none_match=True,
    )
    return BucketProbe(
        probe_id=probe_id,
        content_b64=base64.b64encode(content).decode("ascii"),
        put=ProbePut(url=put.url, headers=put.headers, expires_in_s=put.expires_in_s),
        get_url=store.presign_get(key, PROBE_TTL_S),
    )


def check_probe(store: ObjectStore, secret: str, probe_id: str) -> BucketProbeChecked:
    """Read the probe's object as the server's bucket holds it, then delete it."""
    key = layout.probe_key(probe_id)
    try:
        stored = store.get_bytes(key)
    except ObjectNotFound:
        raise NotFound(
            f"no bucket probe object at {key!r}: upload its content to its PUT URL first",
            code=ErrorCode.bucket_probe_not_found,
        ) from None
    store.delete(key)
    intact = hmac.compare_digest(stored, _content(secret, probe_id)[:PROBE_BYTES])
    return BucketProbeChecked(probe_id=probe_id, size=len(stored), intact=intact)


def sweep_probes(store: ObjectStore, older_than_s: float = PROBE_SWEEP_AGE_S) -> list[str]:
    """Delete the probe objects made more than `older_than_s` ago; their keys."""
    cutoff_ms = (time.time() - older_than_s) * 1000
    gone = []
    for key in store.list(layout.PROBES_PREFIX):
        made = layout.probe_made_ms(key)
        if made is not None and made < cutoff_ms:
            store.delete(key)
            gone.append(key)
    return gone
