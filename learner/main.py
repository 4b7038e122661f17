"""Entry point of `asyncgrpo learner`: settings are parsed by the caller before torch loads.

Under torchrun (or accelerate launch) every rank runs this: rank 0 is the learner, the others
follow it (learner/distributed.py)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from learner.config import LearnerSettings

if TYPE_CHECKING:
    from learner.distributed import DataParallel


def main(settings: LearnerSettings) -> int:
    """Run the learner until its run completes (a pool learner: until stopped); returns the
    process exit code."""
    from learner.distributed import LaunchError, check_rendezvous, rank_env

    try:
        env = rank_env()
        if env is not None and settings.pool:
            raise LaunchError(
                "a pool learner (no --run) runs as one process: data-parallel pool learners "
                "(torchrun, accelerate launch) are not built yet; start it without torchrun, "
                "or give --run with --token"
            )
        if env is not None:
            check_rendezvous()
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    who = "learner" if env is None else f"learner[rank {env.rank}]"
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s {who} %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from learner.trainer import cap_memory

    if env is None:
        cap_memory(settings.device, settings.gpu_memory_fraction)
        if settings.pool:
            from learner.pool import run_pool

            return run_pool(settings)
        return _lead(settings, None)
    from learner.distributed import DataParallel

    dp = DataParallel(
        env,
        device=settings.device,
        collective_timeout_s=settings.collective_timeout_s,
        fsdp=settings.fsdp,
    )
    cap_memory(dp.device, settings.gpu_memory_fraction)
    logging.getLogger("learner").info(
        "rank %d of %d on %s%s", dp.rank, dp.world_size, dp.device, " (FSDP2)" if dp.fsdp else ""
    )
    if not dp.is_leader:
        from learner.follower import follow

        code = follow(settings, dp)
    else:
        code = _lead(settings, dp)
        dp.stop(code)
    dp.close()
    return code


def _lead(settings: LearnerSettings, dp: DataParallel | None) -> int:
    from learner.loop import Learner, RunFinished

    learner = Learner(settings, dp=dp)
    try:
        learner.run()
    except RunFinished as exc:
        if exc.completed:
            logging.getLogger("learner").info("stopping: %s", exc)
            return 0
        logging.getLogger("learner").warning("stopping: %s", exc)
        return 1
    finally:
        learner.tracker.close()  # what the tracker still holds, within --tracking-close-s
    return 0
