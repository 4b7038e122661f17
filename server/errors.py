"""A small error tree rendered by one handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from botocore.exceptions import BotoCoreError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from protocol.error_codes import STATUS, ErrorCode
from protocol.storage import StoreError


class AppError(Exception):
    """A refusal with its HTTP status, a message for people (`detail`) and a code for programs
    (`code`, from protocol/error_codes.py). The code is required, and must be in the table with
    this class's status: a new error cannot be raised without a listed code."""

    status_code = 400

    def __init__(self, message: str, *, code: ErrorCode | str, **extra: Any) -> None:
        super().__init__(message)
        known = ErrorCode(code)  # ValueError: a code missing from protocol/error_codes.py
        if STATUS[known] != self.status_code:
            raise ValueError(
                f"error code {known} answers {STATUS[known]}, not {self.status_code}: "
                "see protocol/error_codes.py"
            )
        self.message = message
        self.code = known
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"detail": self.message, "code": self.code.value, **self.extra}


class BadRequest(AppError):
    status_code = 400


class Unauthorized(AppError):
    status_code = 401


class Forbidden(AppError):
    status_code = 403


class NotFound(AppError):
    status_code = 404


class Conflict(AppError):
    status_code = 409


class FencingLost(Conflict):
    """A fenced call whose token, state or expiry no longer holds: nothing was changed."""


class Unprocessable(AppError):
    status_code = 422


class PayloadTooLarge(AppError):
    status_code = 413


def error_body(detail: str, code: ErrorCode, **extra: Any) -> dict[str, Any]:
    """Every error answer's JSON: `detail` for people, `code` for programs."""
    return {"detail": detail, "code": code.value, **extra}


# The framework's own refusals (Starlette's HTTPException): no route, wrong method, a body it
# could not parse. Any other status keeps its status with the generic code.
_FRAMEWORK_CODES = {
    400: ErrorCode.bad_request,
    404: ErrorCode.route_not_found,
    405: ErrorCode.method_not_allowed,
}


# Told of every refused call (401, 403) before it is answered: the audit log's refusals
# (server/app.py passes server/audit's recorder; docs/architecture/security.md, "The audit log").
OnRefusal = Callable[[Request, int, str], Awaitable[None]]


def install_error_handler(app: FastAPI, on_refusal: OnRefusal | None = None) -> None:
    @app.exception_handler(AppError)
    async def _handle(request: Request, exc: AppError) -> JSONResponse:
        if on_refusal is not None and exc.status_code in (401, 403):
            await on_refusal(request, exc.status_code, exc.code.value)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status_code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _framework(_request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code < 400:
            return Response(status_code=exc.status_code, headers=exc.headers)
        code = _FRAMEWORK_CODES.get(exc.status_code, ErrorCode.http_error)
        return JSONResponse(
            error_body(str(exc.detail), code), status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(StoreError)
    @app.exception_handler(BotoCoreError)
    async def _store_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # The bucket failing is an outage, not a bug: 503 tells clients to back off and retry.
        return JSONResponse(
            error_body(f"object store unavailable: {exc}", ErrorCode.store_unavailable),
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(psycopg.OperationalError)  # the worker calls' async pool
    @app.exception_handler(PoolTimeout)
    async def _database_unavailable(_request: Request, _exc: Exception) -> JSONResponse:
        # A lost connection (the database restarted, the pool is invalidated) or SQLite's busy
        # timeout is transient: 503 tells clients to retry. Other database errors stay 500s.
        return JSONResponse(
            error_body("database unavailable, retry shortly", ErrorCode.database_unavailable),
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def _internal(_request: Request, _exc: Exception) -> JSONResponse:
        # A bug: the server's error middleware logs the traceback; the client gets a body a
        # program can read (never the traceback).
        return JSONResponse(
            error_body("internal server error", ErrorCode.internal_error), status_code=500
        )


class FieldError(BaseModel):
    """One invalid input of a request that failed validation."""

    field: str = Field(description="Dotted location, e.g. `query.limit`, `manifest.key`.")
    message: str = Field(description="Why the value was refused.")
    type: str = Field(description="Machine-readable error type, e.g. `missing`.")


class ErrorBody(BaseModel):
    """Every error body (4xx and 5xx): `detail` for people, `code` for programs, plus `errors`
    for request validation (422) and any fields the error adds (e.g. `field`)."""

    model_config = ConfigDict(extra="allow")

    detail: str = Field(description="What went wrong, for people; its wording may change.")
    code: ErrorCode = Field(
        description="What went wrong, for programs: a stable snake_case code (the table with "
        "each code's HTTP status is in docs/guides/troubleshooting.md). Branch on this, never on "
        "`detail`."
    )
    errors: list[FieldError] | None = Field(
        None, description="Per-field errors, when the request failed validation."
    )


# Statuses the handlers above can answer on the API's (token-taking) operations; an operation
# that declares its own model for one of them keeps it.
_ERROR_STATUSES = {
    "400": "Bad request.",
    "404": "Not found.",
    "409": "Conflict with the current state (e.g. fencing lost).",
    "413": "Request body too large.",
}
_AUTH_STATUSES = {"401": "Missing or invalid bearer token.", "403": "Token of the wrong kind."}


def document_errors(app: FastAPI) -> None:
    """Make the OpenAPI schema describe the error bodies the app really sends: FastAPI's default
    422 model (`detail` as a list of pydantic errors) is replaced by `ErrorBody`, and the
    operations that take a token declare their other error statuses with it too."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        if components.get("ErrorBody") is None:
            _describe_errors(schema, components)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _describe_errors(schema: dict[str, Any], components: dict[str, Any]) -> None:
    body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(body.pop("$defs", {}))
    components["ErrorBody"] = body
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    default_422 = "#/components/schemas/HTTPValidationError"
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            declared_422 = responses.get("422", {}).get("content", {}).get("application/json", {})
            if declared_422.get("schema", {}).get("$ref") == default_422:
                responses["422"]["content"] = ref
            if not operation.get("security"):
                continue  # the open operations declare their own errors
            for status, description in {**_ERROR_STATUSES, **_AUTH_STATUSES}.items():
                responses.setdefault(status, {"description": description, "content": ref})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
