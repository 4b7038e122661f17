"""Dashboard plumbing: templates, the login dependency, the CSRF check, error pages and the
static mount. `install(app)` wires it into the app."""

from __future__ import annotations

from dataclasses import replace
from html import escape
from pathlib import Path
from typing import Annotated, Any

from anyio import to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from protocol.error_codes import ErrorCode
from server.audit import recorder as audit
from server.dashboard.auth import (
    CsrfFailed,
    DashboardSession,
    LoginRequired,
    read_session,
    same,
    submitted_csrf,
)
from server.deps import SessionDep, SettingsDep, released
from server.errors import error_body
from server.tokens import service as tokens

# Package data: shipped in the wheel (pyproject's [tool.setuptools.package-data]).
STATIC_DIR = Path(__file__).resolve().parent / "static"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATES = Jinja2Templates(directory=str(TEMPLATES_DIR))


def _usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _when(value: Any) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int | None) -> str:
    if n is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


TEMPLATES.env.filters.update(usd=_usd, pct=_pct, when=_when, size=_size)


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("csrf", getattr(request.state, "csrf", ""))
    response: HTMLResponse = TEMPLATES.TemplateResponse(
        request, name, context, status_code=status_code
    )
    return response


def require_login(request: Request, session: SessionDep, settings: SettingsDep) -> DashboardSession:
    user = read_session(request, settings)
    token_id = None if user is None else tokens.dashboard_session_token(session, user.session_id)
    if user is None or token_id is None:
        raise LoginRequired()
    request.state.csrf = user.csrf
    return released(session, replace(user, token_id=token_id))


LoginDep = Annotated[DashboardSession, Depends(require_login)]


async def require_csrf(request: Request, user: LoginDep) -> DashboardSession:
    """Every POST of a logged-in page carries the session's CSRF token."""
    if not same(await submitted_csrf(request), user.csrf):
        raise CsrfFailed()
    return user


CsrfDep = Annotated[DashboardSession, Depends(require_csrf)]


def install(app: FastAPI) -> None:
    """Mount the static files, include the pages and render login/CSRF failures."""
    from server.dashboard.audit_page import router as audit_router
    from server.dashboard.projects import router as projects_router
    from server.dashboard.router import router

    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    app.include_router(router)
    app.include_router(projects_router)
    app.include_router(audit_router)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, _exc: LoginRequired) -> Response:
        if request.headers.get("HX-Request"):
            return Response(status_code=200, headers={"HX-Redirect": "/login"})
        return RedirectResponse("/login", status_code=303)

    @app.exception_handler(CsrfFailed)
    async def _csrf(request: Request, _exc: CsrfFailed) -> Response:
        message = "the form's CSRF token is missing or wrong. Reload the page."
        refusal = audit.refusal_of(request, 403, ErrorCode.csrf_failed.value)
        per_minute = request.app.state.settings.audit.refusals_per_minute
        factory = request.app.state.sessionmaker
        await to_thread.run_sync(
            audit.record_refusal, factory, refusal, tokens.identify, per_minute
        )
        return refused(request, message, ErrorCode.csrf_failed)


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def refused(request: Request, message: str, code: ErrorCode, status_code: int = 403) -> Response:
    """A dashboard refusal with its error code (protocol/error_codes.py): the usual JSON error
    body for a request that asks for JSON, else a page that shows the code."""
    if _wants_json(request):
        return JSONResponse(error_body(message, code), status_code=status_code)
    page = f"<p>Refused: {escape(message)}</p>\n<p>Error code: <code>{code.value}</code></p>"
    return HTMLResponse(page, status_code=status_code, headers={"X-Error-Code": code.value})
