"""ASGI middleware that refuses request bodies over a limit with 413 (streamed bodies too)."""

from __future__ import annotations

import json
from typing import Any

from protocol.error_codes import ErrorCode
from server.errors import error_body

Scope = dict[str, Any]


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int, exempt_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt_prefixes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        rejected = False
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen, rejected
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    rejected = True
                    raise _TooLarge()
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            # A body cut off mid-stream (chunked, no Content-Length) may reach the framework as
            # a parse error (400); that answer is replaced by the 413 below.
            nonlocal started
            if rejected:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            pass
        if rejected and not started:
            await self._reject(send)

    async def _reject(self, send: Any) -> None:
        detail = f"request body over {self.max_bytes} bytes"
        body = json.dumps(error_body(detail, ErrorCode.body_too_large)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
