from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import DashboardSession, Token


def db_time(session: Session) -> datetime:
    return session.execute(select(db_now())).scalar_one()


def insert(session: Session, **fields: Any) -> Token:
    token = Token(**fields)
    session.add(token)
    session.flush()
    return token


# Bearer authentication's rule, one definition: a token authenticates unless it is revoked or
# expired (in database time). Authentication reads both flags with the token (to say which
# failed: server/tokens/service.py); worker-token authentication joins them into its one
# definition (server/workers/repository.py authenticated), which every worker call uses.


def revoked(tokens: Any = Token) -> ColumnElement[bool]:
    """`tokens`: the Token model or an alias of it."""
    return tokens.revoked_at.is_not(None)  # type: ignore[no-any-return]


def expired(tokens: Any = Token) -> ColumnElement[bool]:
    return and_(tokens.expires_at.is_not(None), tokens.expires_at <= db_now())


def usable(tokens: Any = Token) -> ColumnElement[bool]:
    """Neither revoked nor expired."""
    return and_(~revoked(tokens), ~expired(tokens))


class Found(NamedTuple):
    """A token looked up by digest, with the rule's verdicts."""

    token: Token
    revoked: bool
    expired: bool


def by_digest(session: Session, digest: str) -> Found | None:
    row = session.execute(
        select(Token, revoked().label("revoked"), expired().label("expired")).where(
            Token.digest == digest
        )
    ).first()
    return None if row is None else Found(row[0], bool(row[1]), bool(row[2]))


def increment_uses(session: Session, token_id: uuid.UUID) -> bool:
    """Compare-and-set: count a use only while under the limit."""
    row = session.execute(
        update(Token)
        .where(
            Token.id == token_id,
            Token.revoked_at.is_(None),
            or_(Token.max_uses.is_(None), Token.uses < Token.max_uses),
        )
        .values(uses=Token.uses + 1, last_used_at=db_now())
        .returning(Token.id)
    ).first()
    return row is not None


def revoke_scope(session: Session, kind: str, scope_id: uuid.UUID) -> int:
    result = session.execute(
        update(Token)
        .where(Token.kind == kind, Token.scope_id == scope_id, Token.revoked_at.is_(None))
        .values(revoked_at=db_now())
        .returning(Token.id)
    )
    return len(result.all())


def count_active(session: Session, kind: str) -> int:
    return session.execute(
        select(func.count())
        .select_from(Token)
        .where(Token.kind == kind, Token.revoked_at.is_(None))
    ).scalar_one()


def by_id(session: Session, token_id: uuid.UUID) -> Token | None:
    return session.get(Token, token_id)


def list_kind(session: Session, kind: str, *, project_id: uuid.UUID | None = None) -> list[Token]:
    """Tokens of one kind, newest first; with `project_id`, only that project's."""
    query = select(Token).where(Token.kind == kind)
    if project_id is not None:
        query = query.where(Token.project_id == project_id)
    return list(session.execute(query.order_by(Token.created_at.desc())).scalars())


def revoke_id(session: Session, token_id: uuid.UUID) -> bool:
    """Revoke one token; False when it was already revoked."""
    row = session.execute(
        update(Token)
        .where(Token.id == token_id, Token.revoked_at.is_(None))
        .values(revoked_at=db_now())
        .returning(Token.id)
    ).first()
    return row is not None


def _live_admin() -> ColumnElement[bool]:
    """An admin token neither revoked nor expired (database time)."""
    return and_(Token.kind == "admin", usable())


def live_admin_ids(session: Session) -> list[uuid.UUID]:
    """Live admin tokens (_live_admin), locked so two revokes cannot both pass the
    last-admin guard (FOR UPDATE is a no-op on SQLite, where writers are serialised)."""
    return list(session.execute(select(Token.id).where(_live_admin()).with_for_update()).scalars())


# -- dashboard sessions ------------------------------------------------------------------------


def insert_dashboard_session(
    session: Session, token_id: uuid.UUID, max_age: timedelta
) -> DashboardSession:
    row = DashboardSession(token_id=token_id, expires_at=db_time(session) + max_age)
    session.add(row)
    session.flush()
    return row


def live_dashboard_session(session: Session, session_id: uuid.UUID) -> uuid.UUID | None:
    """The admin token id behind a dashboard session, while both the session and the admin
    token are live; None otherwise."""
    return session.execute(
        select(Token.id)
        .join(DashboardSession, DashboardSession.token_id == Token.id)
        .where(
            DashboardSession.id == session_id,
            DashboardSession.revoked_at.is_(None),
            DashboardSession.expires_at > db_now(),
            _live_admin(),
        )
    ).scalar_one_or_none()


def revoke_dashboard_sessions(
    session: Session,
    *,
    session_id: uuid.UUID | None = None,
    token_id: uuid.UUID | None = None,
) -> int:
    """Revoke one session, a token's sessions, or (with neither) every live session."""
    query = update(DashboardSession).where(DashboardSession.revoked_at.is_(None))
    if session_id is not None:
        query = query.where(DashboardSession.id == session_id)
    if token_id is not None:
        query = query.where(DashboardSession.token_id == token_id)
    result = session.execute(query.values(revoked_at=db_now()).returning(DashboardSession.id))
    return len(result.all())
