"""A link that loses answers, in front of the real app: the request reaches the app, which
handles and commits it; the answer of a request picked to be lost is read and thrown away, and
the typed client sees a transport error, as when a spot network drops a connection after the
server answered (the safe-retry tests: docs/architecture/protocol.md, "Safe retries")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from protocol.idempotency import IDEMPOTENCY_HEADER


@dataclass
class Sent:
    """One request as the app answered it (whether or not the answer reached the client)."""

    path: str
    key: str | None
    status_code: int
    body: bytes
    lost: bool


@dataclass
class LossyLink:
    """The httpx client surface AsyncGrpoClient uses, over `inner` (a TestClient): the first
    `lose[suffix]` answers to paths ending in `suffix` are lost; `on_loss` runs after each lost
    answer (the app has committed), before the client sees the error."""

    inner: Any
    lose: dict[str, int]
    on_loss: Callable[[Sent], None] = lambda _sent: None
    sent: list[Sent] = field(default_factory=list)

    @property
    def timeout(self) -> Any:
        return self.inner.timeout

    def build_request(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.build_request(*args, **kwargs)

    def send(self, request: Any) -> Any:
        response = self.inner.send(request)
        body = response.read()
        path = request.url.path
        suffix = next((s for s, n in self.lose.items() if n > 0 and path.endswith(s)), None)
        answered = Sent(
            path,
            request.headers.get(IDEMPOTENCY_HEADER),
            response.status_code,
            body,
            suffix is not None,
        )
        self.sent.append(answered)
        if suffix is None:
            return response
        self.lose[suffix] -= 1
        response.close()
        self.on_loss(answered)
        raise httpx.ReadError("the answer was lost on the way")

    def to(self, suffix: str) -> list[Sent]:
        return [s for s in self.sent if s.path.endswith(suffix)]

    def close(self) -> None:
        pass
