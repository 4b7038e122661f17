"""`asyncgrpo learner` whose MLflow tracker fails from its Nth logged point on, as a tracking
server that goes down mid-run would (the learner code is otherwise unchanged):

    python -m tests.learner.tracking.failing_learner N <asyncgrpo learner arguments>

Points before the Nth reach the MLflow store for real; the Nth raises RuntimeError."""

from __future__ import annotations

import sys
from typing import Any

from learner.tracking.backend_mlflow import MlflowBackend


def _fail_from(n: int) -> None:
    log = MlflowBackend.log
    calls: list[int] = []

    def failing(self: MlflowBackend, *args: Any) -> None:
        calls.append(1)
        if len(calls) >= n:
            raise RuntimeError(f"test: the tracking server is gone (point {len(calls)})")
        log(self, *args)

    MlflowBackend.log = failing  # type: ignore[method-assign]


if __name__ == "__main__":
    _fail_from(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
