"""A pool learner (docs/guides/pool-learners.md): `asyncgrpo learner` without --run. It
registers once with a registration token (the pool token kept in the credentials file, mode
0600, reused on restart for the same server), then takes runs, up to --max-runs held at once,
and trains each on a thread of its own with the per-run Learner (learner/loop.py) under its pool
token, until the run ends or is lost to it (RunLost: a 403 `run_not_held`, or another learner
holding it on re-attach). The runs share one base model and take turns on it
(learner/shared_base.py). A run's failure ends that run's thread only. While it has room, it
takes again every `take_retry_s`, and at once when a run ends."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from learner import pool_memory
from learner.config import POOL_ID_FIELD, LearnerSettings
from learner.shared_base import SharedBase
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
                memory_budget_gb=pool_memory.budget_gb(settings),
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


class HeldRun:
    """A run this pool learner took, trained on its own thread (`start`) until it ends, is lost,
    or fails; `stop()` asks its Learner to stop at its next check."""

    def __init__(
        self, settings: LearnerSettings, token: str, run_id: str, shared: SharedBase
    ) -> None:
        self.settings, self.token, self.run_id, self.shared = settings, token, run_id, shared
        self.ended = threading.Event()
        self.revoked = False  # the pool token was refused (401) while it trained
        self.learner: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._train, name=f"run-{run_id[:8]}", daemon=True)

    def start(self, ended: threading.Event) -> None:
        self._wake = ended
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self.learner is not None:
            self.learner.stop()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _train(self) -> None:
        from learner.loop import Learner, RunFinished, RunLost

        log.info("took run %s", self.run_id)
        settings = self.settings.model_copy(update={"run_id": self.run_id, "token": self.token})
        try:
            self.learner = Learner(settings, pool=True, shared=self.shared)
            if self._stopping.is_set():
                return
            self.learner.run()
            log.info("run %s: done", self.run_id)
        except RunLost as exc:
            log.warning("run %s lost: %s", self.run_id, exc)
        except RunFinished as exc:
            log.info("run %s ended: %s", self.run_id, exc)
        except UnauthorizedError as exc:  # revoked while it trained the run
            log.error("the server %s refused the pool learner token (%s)", settings.server_url, exc)
            self.revoked = True
        except Exception:  # that run's alone: its lease lapses and the others go on
            log.exception("run %s: the learner failed; the other runs go on", self.run_id)
        finally:
            if self.learner is not None:
                self.learner.tracker.close()
            self.ended.set()
            self._wake.set()


def run_pool(settings: LearnerSettings) -> int:
    """Take and train runs, up to --max-runs at once, until stopped (SIGINT) or refused
    (exit 2)."""
    try:
        credential = obtain_credential(settings, _fingerprint(settings.model))
    except PoolRefused as exc:
        log.error("%s", exc)
        return 2
    shared = SharedBase(settings.model, dtype=settings.dtype, device=settings.device)
    held: dict[str, HeldRun] = {}
    try:
        return _take_and_train(settings, credential.token, shared, held)
    finally:
        _stop_all(held)


def _take_and_train(
    settings: LearnerSettings, token: str, shared: SharedBase, held: dict[str, HeldRun]
) -> int:
    path = settings.pool_credentials_path()
    ended = threading.Event()  # set by a run's thread when it ends: take again at once
    memory, said_left = pool_memory.take_memory(settings), set[uuid.UUID]()
    with AsyncGrpoClient(settings.server_url, token, max_retries=30) as client:
        idle = False  # said once per wait, not at every take
        while True:
            for run_id in [r for r, h in held.items() if h.ended.is_set()]:
                if held.pop(run_id).revoked:
                    return 2
            room = settings.max_runs - len(held)
            if room > 0:
                try:
                    answer = client.take_runs(room, memory=memory)
                except ApiError as exc:
                    if exc.status_code >= 500:
                        raise
                    log.error(
                        "the server %s refused the pool learner token in %s (%s: %s); remove "
                        "that file and start again with a new --registration-token",
                        settings.server_url,
                        path,
                        exc.status_code,
                        exc.detail,
                    )
                    return 2
                pool_memory.log_left(answer.left, said_left)
                # `held` too: a take whose answer was lost (and retried) holds its run already
                found = [str(r.run_id) for r in answer.runs] + [str(r) for r in answer.held]
                for run_id in [r for r in dict.fromkeys(found) if r not in held][:room]:
                    held[run_id] = HeldRun(settings, token, run_id, shared)
                    held[run_id].start(ended)
                if not held and not idle:
                    log.info("nothing to take; taking again every %g s", settings.take_retry_s)
                idle = not held
            ended.wait(settings.take_retry_s)
            ended.clear()


def _stop_all(held: dict[str, HeldRun]) -> None:
    """Ask every run's learner to stop, then wait (bounded) for their threads."""
    from learner.loop import CLOSE_WAIT_S

    for run in held.values():
        run.stop()
    for run in held.values():
        run.join(CLOSE_WAIT_S)
