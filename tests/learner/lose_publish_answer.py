"""`asyncgrpo learner` whose first publish of some versions lands on the server but whose answer
is lost on the way back (a read timeout past the client's own retries), so a test can watch
the learner's retry of the same publish get the stored answer (learner/publisher.py).

    python -m tests.learner.lose_publish_answer VERSION[,VERSION...] <asyncgrpo learner args>

The answer to the final publish is lost only once the learner's heartbeat has seen the lease
end (that publish completed the run), so the retry always comes after the heartbeat's 409: the
order a loaded machine sometimes takes, made certain.

The learner code is otherwise unchanged; each lost answer is logged as "test: the answer to the
publish of version N was lost"."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

import httpx

from protocol import schemas_learner as sl
from protocol.client import ApiError, AsyncGrpoClient

log = logging.getLogger("tests.lose_publish_answer")
HEARTBEAT_DEADLINE_S = 120.0  # a beat comes every lease TTL / 3


def _watch_the_heartbeat() -> threading.Event:
    """Set once a learner heartbeat is answered with a lost lease."""
    beat = AsyncGrpoClient.learner_heartbeat
    lost = threading.Event()

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return beat(self, *args, **kwargs)
        except ApiError as exc:
            if exc.lease_lost:
                lost.set()
            raise

    AsyncGrpoClient.learner_heartbeat = watched  # type: ignore[method-assign]
    return lost


def _lose_answers_of(versions: set[int]) -> None:
    publish = AsyncGrpoClient.publish_adapter
    heartbeat_lost = _watch_the_heartbeat()
    lost: set[int] = set()

    def losing(
        self: Any, run_id: str, body: sl.PublishRequest, **kwargs: Any
    ) -> sl.PublishResponse:
        answer = publish(self, run_id, body, **kwargs)
        if body.version in versions - lost:
            lost.add(body.version)
            if body.final:
                if not heartbeat_lost.wait(HEARTBEAT_DEADLINE_S):
                    raise RuntimeError("the heartbeat never saw the completed run's lease end")
                log.info("test: the heartbeat saw the lease end before the final answer")
            log.info("test: the answer to the publish of version %d was lost", body.version)
            raise httpx.ReadTimeout("the answer was lost")
        return answer

    AsyncGrpoClient.publish_adapter = losing  # type: ignore[method-assign]


if __name__ == "__main__":
    _lose_answers_of({int(v) for v in sys.argv[1].split(",")})
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
