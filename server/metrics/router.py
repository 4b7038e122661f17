"""`GET /metrics`: Prometheus text exposition, open like /healthz
(docs/architecture/protocol.md, "Protocol")."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool

from server.metrics.service import DatabaseCollector, WorkerCallCollector
from server.routing import TransactionalRoute

router = APIRouter(tags=["metrics"], route_class=TransactionalRoute)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Per-run and per-worker figures, computed from the database on each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    silent_s = request.app.state.settings.jobs.worker_silent_s
    registry.register(DatabaseCollector(request.app.state.sessionmaker, silent_s))
    registry.register(WorkerCallCollector(dict(request.app.state.worker_calls)))
    body = await run_in_threadpool(generate_latest, registry)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
