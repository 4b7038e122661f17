"""The calling worker, as the worker calls authenticate it: in the handler's own transaction
and thread-pool hop (as_worker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from server.db import transaction
from server.models import Worker
from server.request_deps import Credentials
from server.tokens.auth import bearer_token
from server.workers.service import worker_for_token

T = TypeVar("T")


def authenticated_worker(session: Session, credentials: Credentials) -> Worker:
    """The calling worker (401/403 as for every token); the worker calls' auth."""
    return worker_for_token(session, bearer_token(credentials))


async def as_worker(
    request: Request, credentials: Credentials, work: Callable[[Session, Worker], T]
) -> T:
    """Authenticate the worker and run `work` in one transaction, in one thread-pool hop."""
    factory = request.app.state.sessionmaker

    def run() -> T:
        with transaction(factory) as session:
            return work(session, authenticated_worker(session, credentials))

    return await run_in_threadpool(run)
