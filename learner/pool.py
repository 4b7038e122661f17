"""A pool learner (docs/guides/pool-learners.md): `asyncgrpo learner` without --run. It
registers once with a registration token (the pool token kept in the credentials file, mode
0600, reused on restart for the same server), then takes one run at a time and trains it with
the per-run Learner (learner/loop.py) under its pool token until the run ends or is lost to it
(RunLost: a 403 `run_not_held`, or another learner holding it on re-attach); then it takes
again, waiting `take_retry_s` while nothing is takeable."""

from __future__ import annotations

import logging
import time

from learner.config import POOL_ID_FIELD, LearnerSettings
from protocol import credentials
from protocol.client import ApiError, AsyncGrpoClient, UnauthorizedError

log = logging.getLogger("learner")


class PoolRefused(RuntimeError):
    """The pool learner cannot start or go on: no credential, or the server refuses it."""


def obtain_credential(settings: LearnerSettings, fingerprint: str) -> credentials.StoredCredential:
    """The stored pool credential for this server, or a new one from registering (saved)."""
    path = settings.pool_credentials_path()
    stored = credentials.load(path, settings.server_url, POOL_ID_FIELD)
    if stored is not None:
        log.info("rejoining as pool learner %s (its token in %s)", stored.id, path)
        return stored
    if settings.registration_token is None:
        raise PoolRefused(
            f"no pool learner credential for {settings.server_url} in {path} and no "
            "--registration-token given"
        )
    with AsyncGrpoClient(settings.server_url, max_retries=30) as anonymous:
        try:
            answer = anonymous.register_pool_learner(
                settings.registration_token,
                name=settings.name,
                model=settings.model,
                tokenizer_fingerprint=fingerprint,
                max_runs=settings.max_runs,
                gpu_type=settings.gpu_type,
                price_per_hour=settings.price_per_hour,
            )
        except ApiError as exc:
            if exc.status_code >= 500:
                raise
            raise PoolRefused(
                f"the server {settings.server_url} refused to register this pool learner "
                f"({exc.status_code}: {exc.detail}); ask an admin for a new registration token"
            ) from None
    stored = credentials.StoredCredential(
        str(answer.learner_id), answer.learner_token, settings.server_url
    )
    credentials.save(path, stored, POOL_ID_FIELD)
    log.info("registered as pool learner %s (its token in %s)", stored.id, path)
    return stored


def _fingerprint(model: str) -> str:
    """The tokenizer fingerprint exactly as the Learner reports it on attach."""
    from lm.chat import tokenizer_fingerprint
    from lm.models import load_tokenizer

    return str(tokenizer_fingerprint(load_tokenizer(model)))


def run_pool(settings: LearnerSettings) -> int:
    """Take and train runs, one at a time, until stopped (SIGINT) or refused (exit 2)."""
    try:
        credential = obtain_credential(settings, _fingerprint(settings.model))
    except PoolRefused as exc:
        log.error("%s", exc)
        return 2
    path = settings.pool_credentials_path()
    with AsyncGrpoClient(settings.server_url, credential.token, max_retries=30) as client:
        idle = False  # said once per wait, not at every take
        while True:
            try:
                answer = client.take_runs(settings.max_runs)
            except ApiError as exc:
                if exc.status_code >= 500:
                    raise
                log.error(
                    "the server %s refused the pool learner token in %s (%s: %s); remove that "
                    "file and start again with a new --registration-token",
                    settings.server_url,
                    path,
                    exc.status_code,
                    exc.detail,
                )
                return 2
            # `held` too: a take whose answer was lost (and retried) holds its run already
            taken = [r.run_id for r in answer.runs] or answer.held
            if not taken:
                if not idle:
                    log.info("nothing to take; taking again every %g s", settings.take_retry_s)
                idle = True
                time.sleep(settings.take_retry_s)
                continue
            idle = False
            try:
                _train(settings, credential.token, str(taken[0]))
            except UnauthorizedError as exc:  # revoked while it trained the run
                log.error(
                    "the server %s refused the pool learner token (%s)", settings.server_url, exc
                )
                return 2


def _train(settings: LearnerSettings, token: str, run_id: str) -> None:
    """Train one taken run with the per-run Learner until it ends or is lost to this learner."""
    from learner.loop import Learner, RunFinished, RunLost

    log.info("took run %s", run_id)
    learner = Learner(settings.model_copy(update={"run_id": run_id, "token": token}), pool=True)
    try:
        learner.run()
        log.info("run %s: done; taking the next", run_id)
    except RunLost as exc:
        log.warning("run %s lost: %s; taking the next", run_id, exc)
    except RunFinished as exc:
        log.info("run %s ended: %s; taking the next", run_id, exc)
    finally:
        learner.tracker.close()
