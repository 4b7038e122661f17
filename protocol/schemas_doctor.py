"""Wire models of the calls `asyncgrpo doctor` makes before a host joins
(docs/architecture/protocol.md, "Host checks"): the calling token as the server sees it, a
run's model as a host must load it, and a bucket probe through the URLs the server signs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

TokenKind = Literal["admin", "registration", "worker", "learner", "pool_learner"]


class TokenCheck(BaseModel):
    """The bearer token of the call, and the server's release."""

    kind: TokenKind = Field(description="The token's kind.")
    prefix: str = Field(description="Its display prefix (prefix + 6 characters).")
    name: str | None = Field(description="Its label, if it has one.")
    expires_at: datetime | None = Field(description="When it expires (None: never).")
    run_id: uuid.UUID | None = Field(description="A learner token's run (None for other kinds).")
    worker_id: uuid.UUID | None = Field(
        description="A worker token's worker (None for other kinds)."
    )
    pool_learner_id: uuid.UUID | None = Field(
        None, description="A pool learner token's pool learner (None for other kinds)."
    )
    uses: int | None = Field(description="A registration token's registrations so far.")
    max_uses: int | None = Field(
        description="A registration token's limit of registrations (None: no limit, or not a "
        "registration token)."
    )
    server_version: str = Field(description="The asyncgrpo release the server runs.")


class RunModel(BaseModel):
    """What a host must load to work on a run."""

    run_id: uuid.UUID = Field(description="The run.")
    status: str = Field(description="The run's status.")
    base_model: str = Field(description="The base model the run trains (HF id, folder or alias).")
    tokenizer_fingerprint: str | None = Field(
        description="The tokenizer fingerprint (protocol/fingerprint.py) the learner reported on "
        "its first attach; None until then."
    )


class ProbePut(BaseModel):
    url: str = Field(description="The presigned PUT URL.")
    headers: dict[str, str] = Field(description="Headers the PUT must carry.")
    expires_in_s: int = Field(description="Seconds the URL stays valid.")


class BucketProbe(BaseModel):
    """A probe object the caller writes and reads back through the URLs the server signs."""

    probe_id: str = Field(description="The probe's id (its object: `probes/<probe_id>`).")
    content_b64: str = Field(
        description="The exact bytes to upload (base64): the PUT URL is signed for their "
        "length and sha256 only, and for no overwrite."
    )
    put: ProbePut = Field(description="Where and how to upload them.")
    get_url: str = Field(description="A signed GET URL of the same object.")


class BucketProbeChecked(BaseModel):
    """The probe as the server found it in its bucket, then deleted."""

    probe_id: str = Field(description="The probe's id.")
    size: int = Field(description="The stored object's size in bytes.")
    intact: bool = Field(description="Whether the stored bytes are the probe's content.")
