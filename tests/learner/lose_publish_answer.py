"""`asyncgrpo learner` whose first publish of one version lands on the server but whose answer
is lost on the way back (a read timeout), so a test can watch the learner reconcile the
`version_not_next` its retry is answered (learner/refusals.py).

    python -m tests.learner.lose_publish_answer VERSION <asyncgrpo learner arguments>

The learner code is otherwise unchanged; the lost answer is logged as "test: the answer to the
publish of version N was lost"."""

from __future__ import annotations

import logging
import sys
from typing import Any

import httpx

from protocol import schemas_learner as sl
from protocol.client import AsyncGrpoClient

log = logging.getLogger("tests.lose_publish_answer")


def _lose_answer_of(version: int) -> None:
    publish = AsyncGrpoClient.publish_adapter
    lost: list[int] = []

    def losing(self: Any, run_id: str, body: sl.PublishRequest) -> sl.PublishResponse:
        answer = publish(self, run_id, body)
        if body.version == version and not lost:
            lost.append(version)
            log.info("test: the answer to the publish of version %d was lost", version)
            raise httpx.ReadTimeout("the answer was lost")
        return answer

    AsyncGrpoClient.publish_adapter = losing  # type: ignore[method-assign]


if __name__ == "__main__":
    _lose_answer_of(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
