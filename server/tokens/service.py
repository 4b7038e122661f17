"""Token minting and verification (invariant 9): high-entropy, prefixed, digests only at rest,
constant-time comparison, revocable, expiring, use-limited."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from protocol.error_codes import ErrorCode
from server.errors import Conflict, Forbidden, NotFound, Unauthorized
from server.models import Token
from server.tokens import repository
from server.tokens.schemas import (
    ProjectTokenCreate,
    ProjectTokenCreated,
    RegistrationTokenCreate,
    RegistrationTokenCreated,
    TokenOut,
)

PREFIXES = {
    "admin": "agr_adm_",
    "project": "agr_prj_",
    "registration": "agr_reg_",
    "worker": "agr_wkr_",
    "learner": "agr_lrn_",
    "pool_learner": "agr_pln_",
}
KIND_BY_PREFIX = {prefix: kind for kind, prefix in PREFIXES.items()}


def digest(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


@dataclass(frozen=True)
class MintedToken:
    token: Token
    plaintext: str


def mint(
    session: Session,
    kind: str,
    *,
    name: str | None = None,
    scope_id: uuid.UUID | None = None,
    ttl: timedelta | None = None,
    max_uses: int | None = None,
    now: datetime | None = None,
    project_id: uuid.UUID | None = None,
    role: str | None = None,
) -> MintedToken:
    plaintext = PREFIXES[kind] + secrets.token_urlsafe(32)
    expires_at = (now or repository.db_time(session)) + ttl if ttl else None
    token = repository.insert(
        session,
        kind=kind,
        digest=digest(plaintext),
        prefix=plaintext[: len(PREFIXES[kind]) + 6],
        name=name,
        scope_id=scope_id,
        expires_at=expires_at,
        max_uses=max_uses,
        project_id=project_id,
        role=role,
    )
    return MintedToken(token, plaintext)


# A registration token's project is named by name or id, within its creator's reach: the
# projects feature's `resolve_for` (server/projects/service.py), above tokens in the feature
# order, which the composition root hands in (server/wiring.py).
ProjectResolver = Callable[[Session, uuid.UUID | None, str | None, str], uuid.UUID]
_project_resolver: list[ProjectResolver] = []


def resolve_projects_with(resolver: ProjectResolver) -> None:
    _project_resolver[:] = [resolver]


def _project_of(session: Session, ref: str | None, reach: uuid.UUID | None) -> uuid.UUID | None:
    """The project a registration token names (422 unknown_project naming `project`, also for
    one out of the creator's reach: a project token's project; None: every project). None: a
    shared token, which only an admin makes. A project token's token is of its own project."""
    if ref is None and reach is None:
        return None
    if not _project_resolver:
        raise RuntimeError("no project resolver: call server.wiring.wire() at start")
    return _project_resolver[0](session, reach, ref, "project")


def create_registration_token(
    session: Session, body: RegistrationTokenCreate, reach: uuid.UUID | None = None
) -> RegistrationTokenCreated:
    """A registration token with the body's name, lifetime, uses and project (none: shared,
    which only an admin makes; a project token's creator, `reach` its project: its own
    project); its plaintext is in the answer, the only place it is ever shown
    (POST /api/v1/registration-tokens and `asyncgrpo registration-token create`)."""
    project_id = _project_of(session, body.project, reach)
    minted = mint(
        session,
        "registration",
        name=body.name,
        ttl=timedelta(hours=body.ttl_hours),
        max_uses=body.max_uses,
        project_id=project_id,
    )
    t = minted.token
    return RegistrationTokenCreated(
        id=t.id, token=minted.plaintext, prefix=t.prefix, expires_at=t.expires_at,
        max_uses=t.max_uses, project_id=t.project_id,
    )  # fmt: skip


def create_project_token(
    session: Session, project_id: uuid.UUID, body: ProjectTokenCreate
) -> ProjectTokenCreated:
    """A project token of one role (server/tokens/roles.py), with the body's name and optional
    lifetime; its plaintext is in the answer only (POST /api/v1/projects/{id}/tokens)."""
    ttl = timedelta(hours=body.ttl_hours) if body.ttl_hours is not None else None
    minted = mint(
        session, "project", name=body.name, ttl=ttl, project_id=project_id, role=body.role
    )
    out = TokenOut.model_validate(minted.token)
    return ProjectTokenCreated(**out.model_dump(), token=minted.plaintext)


def list_project_tokens(session: Session, project_id: uuid.UUID) -> list[Token]:
    return repository.list_kind(session, "project", project_id=project_id)


def revoke_project_token(session: Session, project_id: uuid.UUID, token_id: uuid.UUID) -> Token:
    """Revoke one of a project's tokens (idempotent); a token of another project or kind is
    not found. Its dashboard sessions end with it."""
    token = repository.by_id(session, token_id)
    if token is None or token.kind != "project" or token.project_id != project_id:
        raise NotFound(f"no token {token_id} in this project", code=ErrorCode.token_not_found)
    repository.revoke_id(session, token_id)
    repository.revoke_dashboard_sessions(session, token_id=token_id)
    session.refresh(token)
    return token


def authenticate(session: Session, plaintext: str, allowed: tuple[str, ...]) -> Token:
    """Resolve a bearer token. 401 when unknown, revoked or expired; 403 when valid but of a
    kind this endpoint does not take."""
    wanted = digest_of_bearer(plaintext)
    return check(repository.by_digest(session, wanted), wanted, allowed)


def identify(session: Session, plaintext: str) -> Token | None:
    """The token a bearer string is, live or not, or None: who a refused call presented
    (server/audit/recorder.py). Never authenticates anything."""
    if not plaintext.startswith(tuple(KIND_BY_PREFIX)):
        return None
    found = repository.by_digest(session, digest(plaintext))
    return None if found is None else found.token


def digest_of_bearer(plaintext: str) -> str:
    """The digest to look up; a string without one of our prefixes is refused unread."""
    if not plaintext.startswith(tuple(KIND_BY_PREFIX)):
        raise Unauthorized("invalid token", code=ErrorCode.token_invalid)
    return digest(plaintext)


def check(found: repository.Found | None, wanted: str, allowed: tuple[str, ...]) -> Token:
    """The token, or why it does not authenticate a caller of this endpoint (401, 403): the
    rule's verdicts come with the token (repository.revoked, repository.expired)."""
    token = None if found is None else found.token
    if found is None or token is None or not hmac.compare_digest(token.digest, wanted):
        raise Unauthorized("invalid token", code=ErrorCode.token_invalid)
    if found.revoked:
        raise Unauthorized("token revoked", code=ErrorCode.token_revoked)
    if found.expired:
        raise Unauthorized("token expired", code=ErrorCode.token_expired)
    if token.kind not in allowed:
        raise Forbidden(
            f"a {token.kind} token cannot call this endpoint", code=ErrorCode.token_kind_forbidden
        )
    return token


def consume_registration(session: Session, token: Token) -> None:
    """Count one use of a registration token, atomically against its limit."""
    if not repository.increment_uses(session, token.id):
        raise Unauthorized(
            "registration token has reached its use limit",
            code=ErrorCode.registration_token_exhausted,
        )


def revoke_scope(session: Session, kind: str, scope_id: uuid.UUID) -> int:
    return repository.revoke_scope(session, kind, scope_id)


def admin_token_count(session: Session) -> int:
    return repository.count_active(session, "admin")


# -- revocation and dashboard sessions -----------------------------------------------------------


def list_tokens(session: Session, kind: str, project_id: uuid.UUID | None = None) -> list[Token]:
    """Tokens of one kind, newest first; of one project when given (None: every one)."""
    return repository.list_kind(session, kind, project_id=project_id)


def revoke(
    session: Session,
    kind: str,
    token_id: uuid.UUID,
    *,
    force: bool = False,
    reach: uuid.UUID | None = None,
) -> Token:
    """Revoke an admin or registration token (idempotent); with `reach` (a project token's
    project), only one of that project: any other is not found. Revoking an admin token ends
    its dashboard sessions. The last live admin token is kept unless `force`: without it nobody
    could call the API or log in until `asyncgrpo admin-token create` is run on the server."""
    token = repository.by_id(session, token_id)
    out_of_reach = reach is not None and (token is None or token.project_id != reach)
    if token is None or token.kind != kind or out_of_reach:
        raise NotFound(f"no {kind} token {token_id}", code=ErrorCode.token_not_found)
    if kind == "admin" and not force and token.revoked_at is None:
        live = repository.live_admin_ids(session)
        if live == [token_id]:
            raise Conflict(
                "this is the last live admin token; revoking it locks everyone out "
                "(pass force=true, then mint a new one with `asyncgrpo admin-token create`)",
                code=ErrorCode.last_admin_token,
            )
    repository.revoke_id(session, token_id)
    if kind == "admin":
        repository.revoke_dashboard_sessions(session, token_id=token_id)
    session.refresh(token)
    return token


def start_dashboard_session(session: Session, token_id: uuid.UUID, max_age_s: float) -> uuid.UUID:
    return repository.insert_dashboard_session(session, token_id, timedelta(seconds=max_age_s)).id


def dashboard_session_token(session: Session, session_id: uuid.UUID) -> uuid.UUID | None:
    """The admin token of a live dashboard session, or None (ended, expired, token revoked)."""
    return repository.live_dashboard_session(session, session_id)


def end_dashboard_session(session: Session, session_id: uuid.UUID) -> None:
    repository.revoke_dashboard_sessions(session, session_id=session_id)


def end_all_dashboard_sessions(session: Session) -> int:
    """Log out everywhere: every live dashboard session ends; returns how many."""
    return repository.revoke_dashboard_sessions(session)
