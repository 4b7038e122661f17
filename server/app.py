"""The control plane: REST API v1, the rollout proxy, signed blob URLs and the dashboard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import Request

from protocol.error_codes import ErrorCode
from protocol.requirements import release
from server.adapters.router import router as adapters_router
from server.api_docs import install as install_api_docs
from server.audit import recorder as audit
from server.audit.router import router as audit_router
from server.blobs.router import router as blobs_router
from server.bucket import BucketWatch
from server.config import Settings, get_settings
from server.dashboard.web import install as install_dashboard
from server.datasets.router import DATASETS_PATH
from server.datasets.router import router as datasets_router
from server.db import make_engine, make_sessionmaker, transaction
from server.db_async import libpq_url, open_pool
from server.deps import refuse_unstorable_text
from server.doctor.router import router as doctor_router
from server.errors import ErrorBody, FieldError, document_errors, install_error_handler
from server.evals.router import router as evals_router
from server.health import router as health_router
from server.jobs.inprocess import start_if_inprocess
from server.learner.eval_router import router as learner_evals_router
from server.learner.router import router as learner_router
from server.learners.router import router as learners_router
from server.leases.router import router as leases_router
from server.leases.units import WorkerCalls, WorkerDb
from server.limits import BodySizeLimit
from server.metrics.router import router as metrics_router
from server.projects.router import router as projects_router
from server.runs.router import router as runs_router
from server.security_headers import SecurityHeaders
from server.storage_factory import make_store
from server.sweeps.router import router as sweeps_router
from server.tokens import auth as tokens_auth
from server.tokens import service as tokens
from server.tokens.router import router as tokens_router
from server.versions.router import router as versions_router
from server.versions.service import make_watch
from server.wakeups import WAKEUPS, Listener, close_on_exit_signals
from server.wiring import wire
from server.workers.router import router as workers_router


def create_app(settings: Settings | None = None, *, migrate: bool | None = None) -> FastAPI:
    settings = settings or get_settings()
    wire()
    engine = make_engine(
        settings.database_url,
        **(
            {}
            if settings.embedded
            else {
                "pool_size": settings.database_pool_size,
                "max_overflow": settings.database_max_overflow,
            }
        ),
    )
    if migrate if migrate is not None else settings.embedded:
        from server.migrate import upgrade  # Alembic loads only when the server migrates

        upgrade(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Sync endpoints run in this many threads: more threads only contend for the GIL (the
        # long-polls wait on the event loop, not in a thread).
        to_thread.current_default_thread_limiter().total_tokens = settings.server_threads
        app.state.bucket_watch.start_check()  # a missing or another database's bucket: no start
        app.state.bucket_watch.start()
        if settings.print_admin_token:
            bootstrap_admin_token(app)

        scheduler = start_if_inprocess(settings, app.state.sessionmaker, app.state.store)
        app.state.scheduler = scheduler
        app.state.worker_db.pool = await open_pool(settings)
        listener = app.state.wakeup_listener = _start_wakeups(settings)
        try:
            yield
        finally:
            WAKEUPS.close()  # every waiting call answers now
            if listener is not None:
                await listener.close()
            app.state.bucket_watch.stop()
            await app.state.version_watch.close()
            if app.state.worker_db.pool is not None:
                await app.state.worker_db.pool.close()
                app.state.worker_db.pool = None
            if scheduler is not None:
                scheduler.stop()
            engine.dispose()

    app = FastAPI(
        title="asyncgrpo",
        version=release(),
        description="Asynchronous GRPO + LoRA on elastic, preemptible GPUs.",
        lifespan=lifespan,
        docs_url=None,  # server/api_docs.py serves /docs from the package, no CDN
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    # the lease engine's database; on Postgres its async pool is opened by the lifespan
    app.state.worker_db = WorkerDb(app.state.sessionmaker, engine.dialect.name == "postgresql")
    app.state.worker_calls = WorkerCalls()
    app.state.version_watch = make_watch(app.state)
    app.state.store = make_store(settings)
    app.state.bucket_watch = BucketWatch(app.state.sessionmaker, app.state.store, settings)
    install_error_handler(app, on_refusal=_audit_refusal)
    _install_validation_handler(app)
    document_errors(app)
    _include_routers(app)

    install_dashboard(app)

    install_api_docs(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.security.max_body_bytes,
        exempt_prefixes=("/blobs/", DATASETS_PATH),
    )
    app.add_middleware(SecurityHeaders)  # outermost: the 413s carry the headers too
    return app


async def _audit_refusal(request: Request, status: int, code: str) -> None:
    """A refused call into the audit log, in a transaction of its own (off the event loop)."""
    refusal = audit.refusal_of(request, status, code)
    per_minute = request.app.state.settings.audit.refusals_per_minute
    await to_thread.run_sync(
        audit.record_refusal, request.app.state.sessionmaker, refusal, tokens.identify, per_minute
    )


def _start_wakeups(settings: Settings) -> Listener | None:
    """Waiting calls wake on this loop's signals, end at SIGINT/SIGTERM, and on Postgres hear
    the other processes' signals through this app's listener (server/wakeups.py)."""
    WAKEUPS.open()
    close_on_exit_signals()
    if not settings.database_url.startswith("postgresql"):
        return None
    listener = Listener(libpq_url(settings.database_url))
    listener.start()
    return listener


def _include_routers(app: FastAPI) -> None:

    # JSON API routers: text Postgres cannot store is a 422, not a 500 at the first query.
    json_api = [Depends(refuse_unstorable_text)]
    # Routes are matched in order: the worker and learner calls, the hot path, come first.
    for router in (
        leases_router,
        versions_router,
        learner_router,
        learner_evals_router,
        learners_router,
        evals_router,
        runs_router,
        sweeps_router,
        projects_router,
        adapters_router,
        tokens_router,
        workers_router,
        doctor_router,
    ):
        app.include_router(router, dependencies=json_api)
    # Not a JSON API router: an upload's body (e.g. application/x-ndjson) is streamed, never
    # read whole by refuse_unstorable_text; its rows are checked as they stream.
    app.include_router(datasets_router)
    # server/audit sits below tokens (every feature's handlers record into it), so its read
    # API takes its admin guard here, from the composition root.
    app.include_router(audit_router, dependencies=[*json_api, Depends(tokens_auth.require_admin)])
    app.include_router(health_router)
    app.include_router(blobs_router)
    app.include_router(metrics_router)


def _install_validation_handler(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(
                field=".".join(str(p) for p in err.get("loc", ()) if p != "body"),
                message=err.get("msg", ""),
                type=err.get("type", ""),
            )
            for err in exc.errors()
        ]
        body = ErrorBody(detail="invalid request", code=ErrorCode.validation_failed, errors=errors)
        return JSONResponse(body.model_dump(mode="json"), status_code=422)


def bootstrap_admin_token(app: FastAPI) -> None:
    mint_first_admin_token(app.state.sessionmaker)


def mint_first_admin_token(factory: sessionmaker[Session]) -> None:
    """With no admin token yet (a new database, SQLite or Postgres), mint one and print it
    once. `asyncgrpo server --workers N` calls this before it starts the N processes, so one
    token is printed, not one per process."""

    with transaction(factory) as session:
        if tokens.admin_token_count(session) > 0:
            return
        minted = tokens.mint(session, "admin", name="bootstrap")
        first_start = {"kind": "admin", "via": "the first start"}
        audit.on_the_server("token.create").record(
            session, None, "token", minted.token.id, detail=first_start
        )
    print(
        "\n  asyncgrpo: first start — admin token (shown once, keep it):\n"
        f"    {minted.plaintext}\n",
        flush=True,
    )
