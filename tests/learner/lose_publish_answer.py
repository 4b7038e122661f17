"""`asyncgrpo learner` whose first publish of some versions lands on the server but whose answer
is lost on the way back (a read timeout past the client's own retries), so a test can watch
the learner's retry of the same publish get the stored answer (learner/publisher.py).

    python -m tests.learner.lose_publish_answer VERSION[,VERSION...] <asyncgrpo learner args>

The learner code is otherwise unchanged; each lost answer is logged as "test: the answer to the
publish of version N was lost"."""

from __future__ import annotations

import logging
import sys
from typing import Any

import httpx

from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient

log = logging.getLogger("tests.lose_publish_answer")


def _lose_answers_of(versions: set[int]) -> None:
    publish = AsyncGrpoClient.publish_adapter
    lost: set[int] = set()

    def losing(
        self: Any, run_id: str, body: sl.PublishRequest, **kwargs: Any
    ) -> sl.PublishResponse:
        answer = publish(self, run_id, body, **kwargs)
        if body.version in versions - lost:
            lost.add(body.version)
            log.info("test: the answer to the publish of version %d was lost", body.version)
            raise httpx.ReadTimeout("the answer was lost")
        return answer

    AsyncGrpoClient.publish_adapter = losing  # type: ignore[method-assign]


if __name__ == "__main__":
    _lose_answers_of({int(v) for v in sys.argv[1].split(",")})
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
