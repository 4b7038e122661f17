"""Dashboard login: an admin token exchanged for a signed session cookie, and CSRF checks.

The cookie (itsdangerous, keyed by settings.secret_key(), HttpOnly, SameSite=Lax) holds the id
of a server-side session row (dashboard_sessions) and a random CSRF token; it never holds the
token itself. Every request re-checks that the session row and its admin token are both still
live, so logout, revoking the token or "log out everywhere" end the session at once, even for
a copy of the cookie kept elsewhere.
Every POST must carry the session's CSRF token (form field `csrf_token` or header
`X-CSRF-Token`, which htmx sends from the page's hx-headers). The login form itself uses a
double-submit cookie, as there is no session yet.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from server.config import Settings

SESSION_COOKIE = "agr_session"
LOGIN_CSRF_COOKIE = "agr_login_csrf"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
_SALT = "asyncgrpo.dashboard.session"


class LoginRequired(Exception):
    """No valid dashboard session: pages redirect to /login."""


class CsrfFailed(Exception):
    """A POST without the session's CSRF token: 403."""


@dataclass(frozen=True)
class DashboardSession:
    session_id: uuid.UUID
    csrf: str
    token_id: uuid.UUID | None = None  # its admin token, once the session row is checked


def _serializer(settings: Settings) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(settings.secret_key(), salt=_SALT)


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def set_session(response: Response, settings: Settings, session_id: uuid.UUID) -> None:
    value = _serializer(settings).dumps({"sid": str(session_id), "csrf": new_csrf()})
    response.set_cookie(
        SESSION_COOKIE,
        value,
        max_age=settings.dashboard.session_max_age_s,
        httponly=True,
        samesite="lax",
        secure=settings.dashboard.cookie_secure,
        path="/",
    )


def clear_session(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")


def read_session(request: Request, settings: Settings) -> DashboardSession | None:
    """The signed, unexpired session in the request's cookie, or None (its row is checked by
    the caller)."""
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw:
        return None
    try:
        data = _serializer(settings).loads(raw, max_age=settings.dashboard.session_max_age_s)
        return DashboardSession(uuid.UUID(str(data["sid"])), str(data["csrf"]))
    except (BadSignature, KeyError, TypeError, ValueError):
        return None


def same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(str(a), str(b))


async def submitted_csrf(request: Request) -> str | None:
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    form = await request.form()
    value = form.get(CSRF_FIELD)
    return value if isinstance(value, str) else None


def set_login_csrf(response: Response, settings: Settings, value: str) -> None:
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        value,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=settings.dashboard.cookie_secure,
        path="/login",
    )
