"""A worker call made under an Idempotency-Key (docs/architecture/protocol.md, "Safe retries"):
the key is claimed, the call's units run and its answer is stored, all in one transaction
(units.PinnedDb), so a change is never committed without its answer. A repeat of the key gets
that answer, after its token is checked again; a concurrent one waits for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from server.idempotency import store
from server.idempotency.keys import KeyedCall
from server.idempotency.store import Answer
from server.leases.service import Caller
from server.leases.units import PinnedDb
from server.workers.service import worker_for_token

T = TypeVar("T")


async def keyed(
    caller: Caller,
    call: KeyedCall,
    work: Callable[[Caller], Awaitable[T]],
    answer_of: Callable[[T], Answer | None],
) -> Answer | T:
    """The stored answer of a repeat; else the call's answer as stored (`answer_of`), or its
    result when `answer_of` keeps none (it applied nothing: the key is let go)."""
    session = caller.db.sessions()
    try:
        stored = await run_in_threadpool(_claim, session, caller.token, call)
        if stored is not None:
            await run_in_threadpool(session.rollback)
            return stored
        pinned = PinnedDb(caller.db.sessions, caller.db.postgres, session=session)
        result = await work(dataclasses.replace(caller, db=pinned))
        answer = answer_of(result)
        await run_in_threadpool(_keep, session, call, answer)
        return result if answer is None else answer
    except BaseException:
        await run_in_threadpool(session.rollback)
        raise
    finally:
        session.close()


def _claim(session: Session, token: str, call: KeyedCall) -> Answer | None:
    stored = store.claim(session, call)
    if stored is not None:
        worker_for_token(session, token)  # a revoked worker's repeat is refused, not answered
    return stored


def _keep(session: Session, call: KeyedCall, answer: Answer | None) -> None:
    store.keep(session, call, answer)
    session.commit()
