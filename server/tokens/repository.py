from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from server.db_types import db_now
from server.models import Token, Worker


def db_time(session: Session) -> datetime:
    return session.execute(select(db_now())).scalar_one()


def insert(session: Session, **fields: Any) -> Token:
    token = Token(**fields)
    session.add(token)
    session.flush()
    return token


def by_digest(session: Session, digest: str) -> Token | None:
    return session.execute(select(Token).where(Token.digest == digest)).scalar_one_or_none()


def by_digest_with_worker(session: Session, digest: str) -> tuple[Token, Worker | None] | None:
    """The token and the worker it belongs to, in one round trip (every worker call's auth)."""
    row = session.execute(
        select(Token, Worker)
        .outerjoin(Worker, Worker.id == Token.scope_id)
        .where(Token.digest == digest)
    ).first()
    return None if row is None else (row[0], row[1])


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
