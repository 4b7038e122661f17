"""Entry point of `asyncgrpo learner`: settings are parsed by the caller before torch loads."""

from __future__ import annotations

import logging

from learner.config import LearnerSettings


def main(settings: LearnerSettings) -> int:
    """Run the learner until its run completes; returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s learner %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from learner.loop import Learner, RunFinished

    learner = Learner(settings)
    try:
        learner.run()
    except RunFinished as exc:
        logging.getLogger("learner").warning("stopping: %s", exc)
        return 1
    finally:
        learner.tracker.close()  # what the tracker still holds, within --tracking-close-s
    return 0
