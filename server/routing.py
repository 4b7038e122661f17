"""Route class that ends the request's transaction inside the endpoint's own thread.

FastAPI runs a sync endpoint in the threadpool, then validates its response in *another*
threadpool hop, and only then closes the session dependency. Under load every pool thread can
be waiting on a row lock (the run row, for admission) held by a transaction whose commit is
queued behind them: a thread-pool/lock deadlock. Committing (or rolling back) before the
endpoint returns releases the locks in the thread that holds them. The session dependency
remains the only other place that ends a transaction; its commit is then a no-op.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from sqlalchemy.orm import Session


def commits_in_endpoint(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sessions = [v for v in kwargs.values() if isinstance(v, Session)]
        try:
            result = endpoint(*args, **kwargs)
        except BaseException:
            for session in sessions:
                session.rollback()
            raise
        for session in sessions:
            session.commit()
        return result

    return wrapper


class TransactionalRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, commits_in_endpoint(endpoint), **kwargs)
