"""A worker call made under an Idempotency-Key (docs/architecture/protocol.md, "Safe retries"):
the key is claimed, the call's units run and its answer is stored, all in one transaction
(units.PinnedDb), so a change is never committed without its answer. A repeat of the key gets
that answer, after its token is checked again; a concurrent repeat waits for the first to end.

The whole call runs in one request thread, on an event loop of its own: holding the key and the
rows it locked, it never waits for another thread of the pool, whose threads may all be waiting
for those locks (the thread-pool/lock deadlock of server/routing.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from protocol.idempotency import key_time
from server.db import transaction
from server.idempotency import store
from server.idempotency.keys import KeyedCall, keyed_call
from server.idempotency.store import Answer
from server.leases.service import Caller
from server.leases.units import PinnedDb
from server.workers.service import worker_for_token

T = TypeVar("T")


async def lease_key(
    header: str | None, caller: Caller, request: Request, body: BaseModel
) -> KeyedCall | None:
    """The call's key (None without the header). A key that is not a UUIDv7 is judged only
    after the worker token: an unauthenticated call is a 401 whatever its other headers."""
    if header is not None and key_time(header) is None:
        await run_in_threadpool(_authenticate, caller)
    return keyed_call(header, lambda: caller.digest, request, body)


def _authenticate(caller: Caller) -> None:
    with transaction(caller.db.sessions) as session:
        worker_for_token(session, caller.token)


async def keyed(
    caller: Caller,
    call: KeyedCall,
    work: Callable[[Caller], Awaitable[T]],
    answer_of: Callable[[T], Answer | None],
) -> Answer | T:
    """The stored answer of a repeat; else the call's answer as stored (`answer_of`), or its
    result when `answer_of` keeps none (it applied nothing: the key is let go)."""
    return await run_in_threadpool(_in_one_thread, caller, call, work, answer_of)


def _in_one_thread(
    caller: Caller,
    call: KeyedCall,
    work: Callable[[Caller], Awaitable[T]],
    answer_of: Callable[[T], Answer | None],
) -> Answer | T:
    with transaction(caller.db.sessions) as session:
        stored = store.claim(session, call)
        if stored is not None:
            worker_for_token(session, caller.token)  # a revoked worker's repeat is refused
            session.rollback()
            return stored
        pinned = PinnedDb(caller.db.sessions, caller.db.postgres, session=session)
        result = asyncio.run(_run(work, dataclasses.replace(caller, db=pinned)))
        answer = answer_of(result)
        store.keep(session, call, answer)
        return result if answer is None else answer


async def _run(work: Callable[[Caller], Awaitable[T]], caller: Caller) -> T:
    return await work(caller)
