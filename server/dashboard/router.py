"""Dashboard pages (HTML, server-rendered; htmx fragments for the live parts)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile

from protocol.error_codes import ErrorCode
from protocol.gpu_prices import LEARNER_EXAMPLE, WORKER_EXAMPLES
from protocol.run_config import RunConfig
from protocol.schemas import INT_MAX
from server.adapters import service as adapters
from server.audit import recorder as audit_log
from server.audit.recorder import Audit, AuditDep
from server.config import Settings
from server.dashboard import compare, costs, forms, planner, planner_form
from server.dashboard import service as dash
from server.dashboard.auth import (
    LOGIN_CSRF_COOKIE,
    DashboardSession,
    clear_session,
    new_csrf,
    same,
    set_login_csrf,
    set_session,
)
from server.dashboard.web import CsrfDep, LoginDep, refused, render
from server.datasets import service as datasets_service
from server.datasets import upload as dataset_upload
from server.db import transaction
from server.deps import SessionDep, SettingsDep, StoreDep
from server.errors import (
    AppError,
    Conflict,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unprocessable,
)
from server.learner import trajectories
from server.learners import service as pool_learners
from server.models import Project
from server.models.project import DEFAULT_PROJECT_ID
from server.projects import service as projects
from server.routing import TransactionalRoute
from server.runs import lifecycle
from server.runs import service as runs
from server.runs.lifecycle import STATUSES
from server.tokens import service as tokens
from server.wake import wake
from server.workers import repository as workers_repo
from server.workers import service as workers

router = APIRouter(include_in_schema=False, route_class=TransactionalRoute)
NO_NUL = r"^[^\x00]*$"  # Postgres text cannot hold U+0000
Action = Literal["pause", "resume", "cancel"]


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/runs", status_code=303)


# -- login -----------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep) -> HTMLResponse:
    csrf = new_csrf()
    response = render(request, "pages/login.html", csrf=csrf, error=None)
    set_login_csrf(response, settings, csrf)
    return response


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    audit: AuditDep,
    token: Annotated[str, Form()] = "",
    csrf_token: Annotated[str, Form()] = "",
) -> Response:
    if not same(csrf_token, request.cookies.get(LOGIN_CSRF_COOKIE)):
        _refusal(request, session, 403, ErrorCode.csrf_failed, token)
        return refused(request, "reload the login page and try again.", ErrorCode.csrf_failed)
    try:
        admin = tokens.authenticate(session, token.strip(), ("admin",))
    except AppError as exc:
        _refusal(request, session, exc.status_code, exc.code, token)
        reason = "not an admin token" if not isinstance(exc, Unauthorized) else exc.message
        csrf = new_csrf()
        response = render(request, "pages/login.html", 401, csrf=csrf, error=reason)
        set_login_csrf(response, settings, csrf)
        return response
    redirect = RedirectResponse("/runs", status_code=303)
    session_id = tokens.start_dashboard_session(
        session, admin.id, settings.dashboard.session_max_age_s
    )
    audit.record(session, admin, "dashboard_session", session_id)
    set_session(redirect, settings, session_id)
    redirect.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
    return redirect


def _refusal(request: Request, session: Session, status: int, code: ErrorCode, bearer: str) -> None:
    """A refused login, in the request's own transaction (it commits: the page is answered)."""
    refusal = replace(audit_log.refusal_of(request, status, code.value), bearer=bearer.strip())
    per_minute = request.app.state.settings.audit.refusals_per_minute
    audit_log.record_refusal_in(session, refusal, tokens.identify, per_minute)


@router.post("/logout")
def logout(session: SessionDep, user: CsrfDep, audit: AuditDep) -> Response:
    tokens.end_dashboard_session(session, user.session_id)
    audit.record(session, user.token_id, "dashboard_session", user.session_id)
    response = RedirectResponse("/login", status_code=303)
    clear_session(response)
    return response


# -- tokens and sessions ---------------------------------------------------------------------

RevocableKind = Literal["admin", "registration"]


def _tokens_page(request: Request, session: SessionDep, flash: str | None = None) -> HTMLResponse:
    return render(
        request,
        "pages/tokens.html",
        409 if flash else 200,
        page="tokens",
        flash=flash,
        admin_tokens=tokens.list_tokens(session, "admin"),
        registration_tokens=tokens.list_tokens(session, "registration"),
    )


@router.get("/tokens", response_class=HTMLResponse)
def tokens_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return _tokens_page(request, session)


@router.post("/tokens/{kind}/{token_id}/revoke", response_class=HTMLResponse)
def revoke_token(
    request: Request,
    kind: RevocableKind,
    token_id: uuid.UUID,
    session: SessionDep,
    user: CsrfDep,
    audit: AuditDep,
) -> Response:
    try:
        tokens.revoke(session, kind, token_id)
    except Conflict as exc:
        return _tokens_page(request, session, flash=exc.message)
    audit.record(session, user.token_id, "token", token_id, detail={"kind": kind})
    return RedirectResponse("/tokens", status_code=303)


@router.post("/sessions/revoke-all")
def log_out_everywhere(session: SessionDep, user: CsrfDep, audit: AuditDep) -> Response:
    ended = tokens.end_all_dashboard_sessions(session)
    audit.record(session, user.token_id, "dashboard_session", None, detail={"ended": ended})
    response = RedirectResponse("/login", status_code=303)
    clear_session(response)
    return response


# -- runs ------------------------------------------------------------------------------------

StatusQuery = Annotated[str | None, Query(description="Only runs in this state.")]


def _status(status: str | None) -> str | None:
    return status if status in STATUSES else None


ProjectFilter = Annotated[
    str | None, Query(max_length=63, description="Only this project's runs (its name).")
]


def _project(session: Session, name: str | None) -> Project | None:
    """The project the runs are filtered by; none (every project's) for an unknown name."""
    return None if not name else projects.by_name(session, name)


def _runs_query(status: str | None, project: Project | None) -> str:
    """The filters as the table's refresh URL carries them."""
    given = {"status": status, "project": project.name if project else None}
    query = urlencode({k: v for k, v in given.items() if v})
    return f"?{query}" if query else ""


@router.get("/runs", response_class=HTMLResponse)
def runs_page(
    request: Request,
    session: SessionDep,
    _user: LoginDep,
    status: StatusQuery = None,
    project: ProjectFilter = None,
) -> HTMLResponse:
    status, chosen = _status(status), _project(session, project)
    rows = dash.run_rows(session, status, chosen.id if chosen else None)
    return render(
        request,
        "pages/runs.html",
        rows=rows,
        status=status,
        statuses=STATUSES,
        page="runs",
        sweeps=compare.recent_sweeps(session),
        project=chosen,
        projects=projects.list_projects(session),
        table_query=_runs_query(status, chosen),
    )


@router.get("/runs/table", response_class=HTMLResponse)
def runs_table(
    request: Request,
    session: SessionDep,
    _user: LoginDep,
    status: StatusQuery = None,
    project: ProjectFilter = None,
) -> HTMLResponse:
    status, chosen = _status(status), _project(session, project)
    rows = dash.run_rows(session, status, chosen.id if chosen else None)
    return render(request, "components/_runs_table.html", rows=rows, status=status, project=chosen)


def _new_run_context(session: Session, values: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "page": "new",
        "values": values or {},
        "errors": {},
        "rewards": forms.BUILTIN_REWARDS,
        "generators": forms.GENERATORS,
        "kinds": forms.DATASET_KINDS,
        "stored_datasets": datasets_service.list_datasets(session, 100, 0),
        "project_names": [p.name for p in projects.list_projects(session)],
    }


@router.get("/runs/new", response_class=HTMLResponse)
def new_run_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "pages/run_new.html", **_new_run_context(session))


@router.post("/runs/new", response_class=HTMLResponse)
async def create_run(
    request: Request, session: SessionDep, settings: SettingsDep, user: CsrfDep, audit: AuditDep
) -> HTMLResponse:
    form = await request.form()
    upload = form.get("dataset.file")
    has_file = isinstance(upload, UploadFile) and bool(upload.filename)
    stored = form.get("dataset.kind") == "uploaded" and has_file
    jsonl = None
    if isinstance(upload, UploadFile) and not stored:
        jsonl = (await upload.read()).decode("utf-8", errors="replace")
    result = forms.parse(form, jsonl, has_file=stored)
    project_id = _form_project(request, form.get("project"), result)
    if result.config is not None:
        try:
            result.config = runs.with_checked_webhook(result.config, settings.outbound_policy())
        except Unprocessable as exc:
            result.add("alarms.webhook_url", exc.message)
            result.config = None
    if result.config is not None and stored:
        assert isinstance(upload, UploadFile)
        uploaded = replace(audit, action="dataset.upload")
        result.config = await _upload_dataset(
            request, upload, result, settings, project_id, uploaded, user
        )
    created = result.config and _create(session, result, project_id, user.token_id)
    if created:
        audit.record(session, user.token_id, "run", created[0].id)
    if not created:
        values = {k: v for k, v in form.items() if isinstance(v, str)}
        if stored and result.config is not None:  # uploaded: offer it again, no second upload
            values["dataset.id"] = str(getattr(result.config.dataset, "id", ""))
        return _form_again(request, session, values, form.getlist("rewards"), result)
    run, learner_token = created
    if run.status == "preparing":
        session.commit()  # the job must see the run
        wake(request.app.state, "datasets", "run_prep")
    return render(
        request,
        "pages/run_created.html",
        run=run,
        learner_token=learner_token,
        public_url=settings.public_url,
        page="new",
    )


def _form_project(request: Request, name: Any, result: forms.FormResult) -> uuid.UUID:
    """The project the form's run (and its uploaded file) is made in; an unknown one is an
    error on the form's `project` field, and the config is dropped. Read in a transaction of
    its own, as the upload records its row in one: the request's session then starts after
    it (on SQLite a read begun before another write commits cannot write)."""
    try:
        with transaction(request.app.state.sessionmaker) as session:
            return projects.resolve(session, name if isinstance(name, str) and name else None)
    except Unprocessable as exc:
        result.add("project", exc.message)
        result.config = None
        return DEFAULT_PROJECT_ID


async def _upload_dataset(
    request: Request,
    upload: UploadFile,
    result: forms.FormResult,
    settings: Settings,
    project_id: uuid.UUID,
    audit: Audit,
    user: DashboardSession,
) -> RunConfig | None:
    """The form's file through the datasets API's upload (the same checks and limits), into
    the run's project."""

    async def chunks() -> AsyncIterator[bytes]:
        while block := await upload.read(1024 * 1024):
            yield block

    name = (upload.filename or "dataset.jsonl").replace("\x00", "")
    try:
        created = await dataset_upload.receive(
            chunks(),
            name=name[:200],
            fmt=dataset_upload.format_of(name, None),
            store=request.app.state.store,
            factory=request.app.state.sessionmaker,
            limits=settings.datasets,
            project_id=project_id,
            on_recorded=lambda session, dataset: audit.record(
                session, user.token_id, "dataset", dataset.id, detail={"name": dataset.name}
            ),
        )
    except AppError as exc:
        result.add("dataset.file", exc.message)
        return None
    wake(request.app.state, "datasets")
    assert result.config is not None
    return forms.with_dataset_id(result.config, str(created.id))


def _create(
    session: Session,
    result: forms.FormResult,
    project_id: uuid.UUID,
    created_by: uuid.UUID | None,
) -> tuple[Any, str] | None:
    assert result.config is not None
    try:
        return runs.create_run(session, result.config, project_id=project_id, created_by=created_by)
    except Unprocessable as exc:
        session.rollback()
        result.add(str(exc.extra.get("field") or "__all__"), exc.message)
        return None


def _form_again(
    request: Request,
    session: Session,
    values: dict[str, str],
    checked_rewards: list[Any],
    result: forms.FormResult,
) -> HTMLResponse:
    context = _new_run_context(session, values)
    context["errors"] = result.errors
    context["checked_rewards"] = checked_rewards
    return render(request, "pages/run_new.html", 422, **context)


CompareIds = Annotated[
    list[str] | None,
    Query(description=f"The runs to compare (1 to {compare.MAX_COMPARED} run ids)."),
]


def _compare_query(ids: list[uuid.UUID]) -> str:
    return urlencode([("ids", str(i)) for i in ids])


CompareSweep = Annotated[
    uuid.UUID | None, Query(description="Compare the runs of this sweep (instead of ids).")
]


@router.get("/runs/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    session: SessionDep,
    _user: LoginDep,
    ids: CompareIds = None,
    sweep: CompareSweep = None,
) -> HTMLResponse:
    chosen = compare.chosen_ids(session, ids or [], sweep)
    query = f"sweep={sweep}" if sweep is not None else _compare_query(chosen)
    return render(
        request,
        "pages/compare.html",
        page="runs",
        rows=compare.table(session, chosen),
        link=f"/runs/compare?{query}",
        charts_url=f"/runs/compare/charts.json?{query}",
    )


@router.get("/runs/compare/charts.json")
def compare_charts(
    session: SessionDep, _user: LoginDep, ids: CompareIds = None, sweep: CompareSweep = None
) -> JSONResponse:
    return JSONResponse(compare.charts(session, compare.chosen_ids(session, ids or [], sweep)))


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request, run_id: uuid.UUID, session: SessionDep, _user: LoginDep
) -> HTMLResponse:
    live = dash.run_live(session, run_id, _silent_s(request))
    return render(request, "pages/run.html", page="runs", flash=None, **live)


@router.get("/runs/{run_id}/live", response_class=HTMLResponse)
def run_live(
    request: Request, run_id: uuid.UUID, session: SessionDep, _user: LoginDep
) -> HTMLResponse:
    live = dash.run_live(session, run_id, _silent_s(request))
    return render(request, "components/_run_live.html", flash=None, **live)


@router.get("/runs/{run_id}/charts.json")
def run_charts(run_id: uuid.UUID, session: SessionDep, _user: LoginDep) -> JSONResponse:
    return JSONResponse(dash.charts(session, run_id))


@router.get("/runs/{run_id}/trajectory", response_class=HTMLResponse)
def run_trajectory(
    request: Request,
    run_id: uuid.UUID,
    session: SessionDep,
    store: StoreDep,
    _user: LoginDep,
    batch_id: str = "",
    row: str = "0",
) -> HTMLResponse:
    """The run page's trajectory view (HTMX fragment): what went wrong is shown in place."""
    try:
        batch = uuid.UUID(batch_id.strip()) if batch_id.strip() else None
    except ValueError:
        return _trajectory(request, error=f"batch id {batch_id!r} is not a UUID")
    if not (row.strip().isascii() and row.strip().isdigit()) or int(row) > INT_MAX:
        return _trajectory(request, error=f"row {row!r} is not a row number")
    try:
        sample = trajectories.sample(session, store, run_id, batch, int(row))
    except (NotFound, Unprocessable, PayloadTooLarge) as exc:
        return _trajectory(request, error=exc.message)
    return _trajectory(request, sample=sample)


def _trajectory(request: Request, sample: Any = None, error: str | None = None) -> HTMLResponse:
    return render(request, "components/_trajectory.html", sample=sample, error=error)


@router.post("/runs/{run_id}/{action}", response_class=HTMLResponse)
def run_action(
    request: Request,
    run_id: uuid.UUID,
    action: Action,
    session: SessionDep,
    user: CsrfDep,
    audit: AuditDep,
) -> Response:
    flash = None
    try:
        lifecycle.admin_action(session, run_id, action, f"{action} from the dashboard")
    except NotFound:
        raise
    except AppError as exc:
        flash = exc.message
    else:
        audit.record(session, user.token_id, "run", run_id)
    if not request.headers.get("HX-Request"):
        return RedirectResponse(f"/runs/{run_id}", status_code=303)
    live = dash.run_live(session, run_id, _silent_s(request))
    return render(request, "components/_run_live.html", flash=flash, **live)


@router.get("/runs/{run_id}/adapters/{version}/{name}")
def adapter_download(
    run_id: uuid.UUID,
    version: int,
    name: str,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    _user: LoginDep,
) -> RedirectResponse:
    """A short-lived download URL of one adapter file (adapters.service presigns it)."""
    ttl = settings.security.url_ttl_s
    detail = adapters.get_version(session, store, run_id, str(version), ttl)
    for f in detail.files:
        if f.name == name:
            return RedirectResponse(f.url, status_code=303)
    raise NotFound(f"version {version} has no file {name}", code=ErrorCode.file_not_found)


# -- workers ---------------------------------------------------------------------------------


def _silent_s(request: Request) -> float:
    return float(request.app.state.settings.jobs.worker_silent_s)


def _workers_context(request: Request, session: SessionDep) -> dict[str, Any]:
    return {
        "workers": workers.list_workers(session, _silent_s(request)),
        "current": dash.repo.current_leases(session),
    }


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(
        request,
        "pages/workers.html",
        page="workers",
        minted=None,
        **_workers_context(request, session),
    )


@router.get("/workers/table", response_class=HTMLResponse)
def workers_table(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "components/_workers_table.html", **_workers_context(request, session))


@router.post("/workers/{worker_id}/revoke", response_class=HTMLResponse)
def revoke_worker(
    request: Request, worker_id: uuid.UUID, session: SessionDep, user: CsrfDep, audit: AuditDep
) -> Response:
    workers.revoke(session, worker_id, _silent_s(request))
    audit.record(session, user.token_id, "worker", worker_id)
    if not request.headers.get("HX-Request"):
        return RedirectResponse("/workers", status_code=303)
    return render(request, "components/_workers_table.html", **_workers_context(request, session))


@router.post("/workers/{worker_id}/trust", response_class=HTMLResponse)
def trust_worker(
    request: Request, worker_id: uuid.UUID, session: SessionDep, user: CsrfDep, audit: AuditDep
) -> Response:
    response = _mark_trusted(request, worker_id, session, True)
    audit.record(session, user.token_id, "worker", worker_id)
    return response


@router.post("/workers/{worker_id}/untrust", response_class=HTMLResponse)
def untrust_worker(
    request: Request, worker_id: uuid.UUID, session: SessionDep, user: CsrfDep, audit: AuditDep
) -> Response:
    response = _mark_trusted(request, worker_id, session, False)
    audit.record(session, user.token_id, "worker", worker_id)
    return response


def _mark_trusted(
    request: Request, worker_id: uuid.UUID, session: Session, trusted: bool
) -> Response:
    workers.set_trusted(session, worker_id, trusted, _silent_s(request))
    if not request.headers.get("HX-Request"):
        return RedirectResponse("/workers", status_code=303)
    return render(request, "components/_workers_table.html", **_workers_context(request, session))


@router.post("/workers/registration-tokens", response_class=HTMLResponse)
def create_registration_token(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    user: CsrfDep,
    audit: AuditDep,
    name: Annotated[str, Form(max_length=200, pattern=NO_NUL)] = "",
    ttl_hours: Annotated[float, Form(gt=0, le=24 * 365)] = 24.0,
    max_uses: Annotated[int, Form(ge=1, le=10_000)] = 1,
) -> HTMLResponse:
    minted = tokens.mint(
        session,
        "registration",
        name=name or None,
        ttl=timedelta(hours=ttl_hours),
        max_uses=max_uses,
    )
    kind = {"kind": "registration"}
    audit.record(session, user.token_id, "token", minted.token.id, detail=kind)
    return render(
        request,
        "pages/workers.html",
        page="workers",
        minted=minted,
        public_url=settings.public_url,
        **_workers_context(request, session),
    )


# -- pool learners ---------------------------------------------------------------------------


def _learners_context(session: SessionDep) -> dict[str, Any]:
    return {"learners": pool_learners.list_learners(session)}


@router.get("/learners", response_class=HTMLResponse)
def learners_page(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "pages/learners.html", page="learners", **_learners_context(session))


@router.get("/learners/table", response_class=HTMLResponse)
def learners_table(request: Request, session: SessionDep, _user: LoginDep) -> HTMLResponse:
    return render(request, "components/_learners_table.html", **_learners_context(session))


@router.post("/learners/{learner_id}/revoke", response_class=HTMLResponse)
def revoke_learner(
    request: Request, learner_id: uuid.UUID, session: SessionDep, user: CsrfDep, audit: AuditDep
) -> Response:
    pool_learners.revoke(session, learner_id)
    audit.record(session, user.token_id, "learner", learner_id)
    if not request.headers.get("HX-Request"):
        return RedirectResponse("/learners", status_code=303)
    return render(request, "components/_learners_table.html", **_learners_context(session))


# -- cost and planner ------------------------------------------------------------------------


@router.get("/cost", response_class=HTMLResponse)
def cost_page(
    request: Request, session: SessionDep, settings: SettingsDep, _user: LoginDep
) -> HTMLResponse:
    prices = settings.dashboard.on_demand_prices
    page = costs.cost_page(session, prices)
    table = workers_repo.price_table(session)
    return render(
        request, "pages/cost.html", page="cost", cost=page, prices=prices, price_table=table
    )


@router.get("/planner", response_class=HTMLResponse)
def planner_page(
    request: Request,
    session: SessionDep,
    _user: LoginDep,
    model: str = "qwen2.5-7b",
    rank: str = "16",
    targets: str = "all-linear",
    link_gbps: str = "1",
    learner_gpus: str = "1",
    micro_batch_tokens: str = "8192",
    learner_gpu: str = LEARNER_EXAMPLE,
    worker_gpus: str = ", ".join(WORKER_EXAMPLES),
    completion_tokens: str = "512",
    group_size: str = "8",
    bound_groups: str = "16",
    worker_sequences: str = "256",
    accept_fraction: str = "1",
    runs: str = "1",
    samples_per_run: str = "",
    gradient_checkpointing: str = "",
    from_run: str = "",
    fill: str = "",
) -> HTMLResponse:
    skip = ("request", "session", "_user", "fill")
    values = {k: v for k, v in locals().items() if k not in skip}
    error = None
    result = fleet = measured = None
    try:
        measured = planner_form.measured_for_form(session, from_run, values, fill=bool(fill))
        result = planner_form.payload_from_form(values)
        fleet = planner_form.plan_from_form(planner.PRESETS[model], values, measured)
    except ValueError as exc:
        error = str(exc)
    template = (
        "components/_plan.html" if request.headers.get("HX-Request") else "pages/planner.html"
    )
    return render(
        request,
        template,
        page="planner",
        plan=result,
        fleet=fleet,
        measured=measured,
        error=error,
        values=values,
        presets=planner.PRESETS,
        targets=planner.TARGET_LABELS,
        runs=planner_form.runs_to_measure(session),
    )
