"""`asyncgrpo learner` (a pool learner) that stops inside its Nth optimizer step, counted over
all the runs it trains, so a test can kill it mid-step:

    python -m tests.learner.hold_pool_step N <learner arguments>

On its Nth step it logs "test hold: in a step of run R" and sleeps inside the step (and inside
that run's turn on the shared model) instead of training. The learner code is otherwise
unchanged."""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from learner.data import Group
from learner.trainer import Trainer

log = logging.getLogger("tests.hold_pool_step")


def _hold_at(step: int) -> None:
    train_step = Trainer.train_step
    counted = itertools.count(1)

    def hold(self: Trainer, groups: Sequence[Group]) -> Any:
        if next(counted) < step:
            return train_step(self, groups)
        log.info("test hold: in a step of adapter %s", self.adapter_name)
        while True:
            time.sleep(1)

    Trainer.train_step = hold  # type: ignore[method-assign]


if __name__ == "__main__":
    _hold_at(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
