"""A small error tree rendered by one handler."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


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
