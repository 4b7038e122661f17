"""Weights & Biases (extra `tracking-wandb`). The W&B run's id is the asyncgrpo run's id
(resume="allow"), so a restarted learner continues the same W&B run. Offline mode, the host
and the API key are W&B's own variables (WANDB_MODE, WANDB_BASE_URL, WANDB_API_KEY, WANDB_DIR).
Console capture, code, git and machine metadata (which would carry the command line, and with
it `--token`) are off."""

from __future__ import annotations

from typing import Any

from learner.tracking.base import STEP_KEY, Kind
from learner.tracking.spec import TrackerSpec


class WandbBackend:
    def __init__(self) -> None:
        self.run: Any = None

    def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
        import wandb

        settings = wandb.Settings(
            console="off",
            x_disable_meta=True,
            disable_git=True,
            disable_code=True,
            save_code=False,
            x_save_requirements=False,
            silent=True,
        )
        self.run = wandb.init(
            project=spec.project,
            entity=spec.entity,
            name=spec.run_name,
            id=spec.run_id,
            resume="allow",
            config=config,
            tags=list(spec.tags) or None,
            settings=settings,
        )
        for kind, step_key in STEP_KEY.items():
            self.run.define_metric(step_key)
            self.run.define_metric(f"{kind}/*", step_metric=step_key)

    def log(self, kind: Kind, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, STEP_KEY[kind]: step})

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
