"""A tiny real OpenAI-compatible chat endpoint (`POST /v1/chat/completions`) in a thread, for
the llm_judge tests: it records every request and answers as its `answer` function says."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """The judge's answer to one request: a status, the assistant message's content (or a
    raw body when `raw` is set) and a delay before answering."""

    content: str = "10"
    status: int = 200
    delay_s: float = 0.0
    raw: str | None = None


def echo(body: dict[str, Any], n: int) -> Reply:
    """Default: the user message itself as the reply ("7" scores 7)."""
    return Reply(content=body["messages"][-1]["content"])


@dataclass
class FakeJudge:
    url: str = ""
    answer: Callable[[dict[str, Any], int], Reply] = echo
    requests: list[dict[str, Any]] = field(default_factory=list)
    max_active: int = 0
    _active: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
        with self._lock:
            n = len(self.requests)
            self.requests.append(
                {"path": handler.path, "headers": dict(handler.headers), "body": body}
            )
            self._active += 1
            self.max_active = max(self.max_active, self._active)
        try:
            reply = self.answer(body, n) if handler.path == "/v1/chat/completions" else None
            if reply is None:
                reply = Reply(status=404, raw='{"error": "not found"}')
            time.sleep(reply.delay_s)
        finally:
            with self._lock:
                self._active -= 1
        payload = reply.raw
        if payload is None:
            message = {"role": "assistant", "content": reply.content}
            payload = json.dumps({"choices": [{"index": 0, "message": message}]})
        data = payload.encode()
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:  # the client gave up (its timeout): nothing to answer
            pass


@contextmanager
def fake_judge(answer: Callable[[dict[str, Any], int], Reply] = echo) -> Iterator[FakeJudge]:
    """Serve a FakeJudge on a free port of 127.0.0.1; `url` is its base URL (…/v1)."""
    judge = FakeJudge(answer=answer)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            judge.handle(self)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    judge.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield judge
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
