"""HTTP layer of the host checks `asyncgrpo doctor` makes before a host joins: any live token
may call them, and each answers only about the bearer's own token, a run its kind may see, and
a probe object the server signed."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, status

from protocol.schemas_doctor import BucketProbe, BucketProbeChecked, RunModel, TokenCheck
from server.deps import AnyTokenDep, SessionDep, SettingsDep, StoreDep
from server.doctor import service
from server.routing import TransactionalRoute

router = APIRouter(prefix="/api/v1/doctor", tags=["doctor"], route_class=TransactionalRoute)

ProbeId = Annotated[
    str,
    Path(
        pattern=r"^[0-9]{13}-[0-9a-f]{32}$",
        description="The probe's id, as its creation answered it.",
    ),
]


@router.get("/token", response_model=TokenCheck)
def token(token: AnyTokenDep) -> TokenCheck:
    """The bearer token as the server sees it (kind, scope, expiry, uses) and the server's
    release; 401 for a token that is unknown, revoked or expired. Uses nothing up."""
    return service.token_check(token)


@router.get("/runs/{run_id}", response_model=RunModel)
def run_model(run_id: uuid.UUID, session: SessionDep, token: AnyTokenDep) -> RunModel:
    """The run's base model and tokenizer fingerprint, which a host must load; a learner token
    sees only its own run, a pool learner's the runs it holds, a project's worker or
    registration token its project's runs (404 `run_not_found` for another)."""
    return service.run_model(session, token, run_id)


@router.post("/bucket-probes", status_code=status.HTTP_201_CREATED, response_model=BucketProbe)
def create_bucket_probe(_token: AnyTokenDep, store: StoreDep, settings: SettingsDep) -> BucketProbe:
    """A probe of the bucket through the URLs this server signs: a PUT URL for exactly the
    answered 32 bytes (no overwrite), and a GET URL of the same object, for 120 s."""
    return service.new_probe(store, settings.secret_key())


@router.delete("/bucket-probes/{probe_id}", response_model=BucketProbeChecked)
def check_bucket_probe(
    probe_id: ProbeId, _token: AnyTokenDep, store: StoreDep, settings: SettingsDep
) -> BucketProbeChecked:
    """Read the probe's object from the server's side and delete it: `intact` says whether
    it holds the probe's bytes; 404 `bucket_probe_not_found` when it is not there."""
    return service.check_probe(store, settings.secret_key(), probe_id)
