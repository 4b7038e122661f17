"""trackio (extra `tracking-trackio`): local-first, a SQLite file per project under
TRACKIO_DIR (default ~/.cache/huggingface/trackio); TRACKIO_SPACE_ID or TRACKIO_SERVER_URL
(trackio's own variables) send it to a Space or a trackio server instead. The trackio run is
named spec.run_name and resumed by that name after a restart. One x axis per point: the
learner step for `train/*`, the version for `eval/*`."""

from __future__ import annotations

from typing import Any

from learner.tracking.base import STEP_KEY, Kind
from learner.tracking.spec import TrackerSpec


class TrackioBackend:
    def __init__(self) -> None:
        self.run: Any = None

    def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
        import trackio

        self.run = trackio.init(
            project=spec.project,
            name=spec.run_name,
            config={**config, "asyncgrpo_run_id": spec.run_id},
            resume="allow",
            auto_log_cpu=False,
        )

    def log(self, kind: Kind, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, STEP_KEY[kind]: step}, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
