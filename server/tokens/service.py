"""Token minting and verification (invariant 9): high-entropy, prefixed, digests only at rest,
constant-time comparison, revocable, expiring, use-limited."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from server.errors import Forbidden, Unauthorized
from server.models import Token, Worker
from server.tokens import repository

PREFIXES = {
    "admin": "agr_adm_",
    "registration": "agr_reg_",
    "worker": "agr_wkr_",
    "learner": "agr_lrn_",
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
    )
    return MintedToken(token, plaintext)


def authenticate(session: Session, plaintext: str, allowed: tuple[str, ...]) -> Token:
    """Resolve a bearer token. 401 when unknown, revoked or expired; 403 when valid but of a
    kind this endpoint does not take."""
    wanted = digest_of_bearer(plaintext)
    return _check(session, repository.by_digest(session, wanted), wanted, allowed)


def authenticate_worker(session: Session, plaintext: str) -> tuple[Token, Worker | None]:
    """authenticate() for worker tokens, loading the token's worker in the same query."""
    wanted = digest_of_bearer(plaintext)
    found = repository.by_digest_with_worker(session, wanted)
    token = _check(session, found[0] if found else None, wanted, ("worker",))
    assert found is not None
    return token, found[1]


def digest_of_bearer(plaintext: str) -> str:
    """The digest to look up; a string without one of our prefixes is refused unread."""
    if not plaintext.startswith(tuple(KIND_BY_PREFIX)):
        raise Unauthorized("invalid token")
    return digest(plaintext)


def _check(session: Session, token: Token | None, wanted: str, allowed: tuple[str, ...]) -> Token:
    if token is None or not hmac.compare_digest(token.digest, wanted):
        raise Unauthorized("invalid token")
    if token.revoked_at is not None:
        raise Unauthorized("token revoked")
    if token.expires_at is not None and token.expires_at <= repository.db_time(session):
        raise Unauthorized("token expired")
    if token.kind not in allowed:
        raise Forbidden(f"a {token.kind} token cannot call this endpoint")
    return token


def consume_registration(session: Session, token: Token) -> None:
    """Count one use of a registration token, atomically against its limit."""
    if not repository.increment_uses(session, token.id):
        raise Unauthorized("registration token has reached its use limit")


def revoke_scope(session: Session, kind: str, scope_id: uuid.UUID) -> int:
    return repository.revoke_scope(session, kind, scope_id)


def admin_token_count(session: Session) -> int:
    return repository.count_active(session, "admin")
