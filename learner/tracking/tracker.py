"""The learner's one tracker object: resolve, redact, and mirror on a thread of its own."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from learner.config import LearnerSettings
from learner.tracking.backend_mlflow import MlflowBackend
from learner.tracking.backend_trackio import TrackioBackend
from learner.tracking.backend_wandb import WandbBackend
from learner.tracking.base import Backend, Kind
from learner.tracking.redact import redact
from learner.tracking.spec import TrackerSpec, resolve
from protocol.run_config import RunConfig

log = logging.getLogger(__name__)
BACKENDS: Mapping[str, Callable[[], Backend]] = {
    "wandb": WandbBackend,
    "trackio": TrackioBackend,
    "mlflow": MlflowBackend,
}
EXTRAS = {"wandb": "tracking-wandb", "trackio": "tracking-trackio", "mlflow": "tracking-mlflow"}
MAX_PENDING = 10_000  # points waiting for a slow tracker; past it new points are dropped
Point = tuple[Kind, int, dict[str, float]]


def _numbers(values: Mapping[str, Any], prefix: str) -> dict[str, float]:
    return {
        f"{prefix}/{k}": float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class Tracker:
    """Mirrors to the backend the learner's flags or the run config name (none: every call is
    a no-op). Calls return at once: a thread of its own talks to the tracker, and its first
    failure (import, init or log) logs a warning and turns mirroring off; training goes on."""

    def __init__(
        self, settings: LearnerSettings, backends: Mapping[str, Callable[[], Backend]] = BACKENDS
    ) -> None:
        self.settings, self.backends = settings, backends
        self.spec: TrackerSpec | None = None
        self.failed: str | None = None  # why mirroring stopped
        self.dropped = 0  # points not queued (the tracker is behind by MAX_PENDING)
        self._queue: queue.Queue[Point | None] = queue.Queue(MAX_PENDING)
        self._thread: threading.Thread | None = None
        self._started = False

    @property
    def active(self) -> bool:
        return self._thread is not None and self.failed is None

    def start(self, run_id: str, config: RunConfig) -> None:
        """At the first attach: open the tracker's run with the redacted run config. Once per
        process; a re-attach keeps mirroring into the same run."""
        if self._started:
            return
        self._started = True
        self.spec = resolve(self.settings, config.tracking, run_id, config.name)
        if self.spec is None:
            return
        log.info(
            "mirroring metrics to %s (project %s, run %s)",
            self.spec.backend,
            self.spec.project,
            self.spec.run_name,
        )
        backend = self.backends[self.spec.backend]()
        redacted = redact(config.model_dump(mode="json"))
        self._thread = threading.Thread(
            target=self._work, args=(backend, self.spec, redacted), daemon=True, name="tracker"
        )
        self._thread.start()

    def log_step(self, step: int, version: int, values: Mapping[str, Any]) -> None:
        """One optimizer step's metrics (those the server got), as `train/<name>`."""
        self._put(("train", step, {**_numbers(values, "train"), "train/version": float(version)}))

    def log_eval(self, version: int, values: Mapping[str, Any]) -> None:
        """One evaluated version's aggregates (mean reward, accuracy, pass@n), as `eval/…`."""
        self._put(("eval", version, _numbers(values, "eval")))

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued and close the tracker's run, waiting at most timeout_s
        (default: --tracking-close-s)."""
        thread, self._thread = self._thread, None
        if thread is None or not thread.is_alive():
            return
        wait = self.settings.tracking_close_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait  # one bound for the end marker and the join
        try:
            self._queue.put(None, timeout=wait)
        except queue.Full:
            pass
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("the tracker did not finish within %.0f s; what it held is lost", wait)

    def _put(self, point: Point) -> None:
        if not self.active:
            return
        try:
            self._queue.put_nowait(point)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("the tracker is %d points behind; dropping new points", MAX_PENDING)

    def _work(self, backend: Backend, spec: TrackerSpec, config: dict[str, Any]) -> None:
        if not self._safely("start", backend.start, spec, config):
            return
        while (point := self._queue.get()) is not None:
            if not self._safely("log", backend.log, *point):
                return
        self._safely("finish", backend.finish)

    def _safely(self, what: str, call: Callable[..., None], *args: Any) -> bool:
        try:
            call(*args)
            return True
        except Exception as exc:  # any tracker failure: training must go on
            assert self.spec is not None
            hint = ""
            if isinstance(exc, ImportError):
                hint = f" (pip install 'asyncgrpo[{EXTRAS[self.spec.backend]}]')"
            failure = f"{what}: {type(exc).__name__}: {exc}"
            log.warning(
                "tracker %s failed at %s%s; training goes on without it",
                self.spec.backend,
                failure,
                hint,
                exc_info=True,
            )
            # Set after the warning: whoever sees `failed` can also read why.
            self.failed = failure
            return False
