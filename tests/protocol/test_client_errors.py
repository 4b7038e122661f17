"""The typed client raises on error codes: each error answer's `code` is on the exception, and a
lost lease is told by its code (fencing_lost, lease_not_found), not by its status or words."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from protocol.client import ApiError, AsyncGrpoClient, ConflictError, NotFoundError


def _client(status: int, body: Any) -> AsyncGrpoClient:
    def answer(_request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    http = httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(answer))
    return AsyncGrpoClient("http://testserver", "token", http=http, max_retries=0)


@pytest.mark.parametrize(
    ("status", "body", "kind", "code", "lost"),
    [
        (409, {"detail": "any words", "code": "fencing_lost"}, ConflictError, "fencing_lost", True),
        (
            404,
            {"detail": "any words", "code": "lease_not_found"},
            NotFoundError,
            "lease_not_found",
            True,
        ),
        (404, {"detail": "lease not found"}, NotFoundError, None, False),  # no code: not told
        (409, {"detail": "x", "code": "run_ended"}, ConflictError, "run_ended", False),
        (502, "<html>bad gateway</html>", ApiError, None, False),
    ],
)
def test_an_error_answer_raises_with_its_code(
    status: int, body: Any, kind: type[ApiError], code: str | None, lost: bool
) -> None:
    with pytest.raises(kind) as raised:
        _client(status, body).learner_heartbeat(str(uuid.uuid4()), 1)
    assert raised.value.status_code == status
    assert raised.value.code == code and raised.value.lease_lost is lost
