"""A small error tree rendered by one handler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from botocore.exceptions import BotoCoreError
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import OperationalError

from protocol.storage import StoreError


class AppError(Exception):
    status_code = 400

    def __init__(self, message: str, status_code: int | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.extra = extra


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


def install_error_handler(app: FastAPI) -> None:
    @app.exception_handler(AppError)
    async def _handle(_request: Request, exc: AppError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse(
            {"detail": exc.message, **exc.extra}, status_code=exc.status_code, headers=headers
        )

    @app.exception_handler(StoreError)
    @app.exception_handler(BotoCoreError)
    async def _store_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # The bucket failing is an outage, not a bug: 503 tells clients to back off and retry.
        return JSONResponse(
            {"detail": f"object store unavailable: {exc}"},
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
            {"detail": "database unavailable, retry shortly"},
            status_code=503,
            headers={"Retry-After": "1"},
        )


class FieldError(BaseModel):
    """One invalid input of a request that failed validation."""

    field: str = Field(description="Dotted location, e.g. `query.limit`, `manifest.key`.")
    message: str = Field(description="Why the value was refused.")
    type: str = Field(description="Machine-readable error type, e.g. `missing`.")


class ErrorBody(BaseModel):
    """Every 4xx body: `detail`, plus `errors` for request validation (422) and any fields the
    error adds (e.g. `field`)."""

    model_config = ConfigDict(extra="allow")

    detail: str = Field(description="What went wrong.")
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
