"""`asyncgrpo learner` whose rank 1 stops inside one optimizer step, as a rank that hangs or
is about to die, so a test can kill it mid-step (run under torchrun).

    torchrun --standalone --nproc-per-node 2 -m tests.learner.hold_step STEP <learner arguments>

Rank 1, on its share of optimizer step STEP or later, logs "test hold: rank 1 (pid P) in step
N" and sleeps instead of training; rank 0 meanwhile waits in the step's gradient all-reduce.
The learner code is otherwise unchanged."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from learner.trainer import Trainer

log = logging.getLogger("tests.hold_step")


def _hold_from(step: int) -> None:
    train_share = Trainer.train_share

    def hold(self: Trainer, share: Any) -> Any:
        if self.step + 1 < step:
            return train_share(self, share)
        log.info("test hold: rank 1 (pid %d) in step %d", os.getpid(), self.step + 1)
        while True:
            time.sleep(1)

    Trainer.train_share = hold  # type: ignore[method-assign]


if __name__ == "__main__":
    _hold_from(int(sys.argv[1]))
    from asyncgrpo.cli import app

    sys.argv = ["asyncgrpo", "learner", *sys.argv[2:]]
    app()
