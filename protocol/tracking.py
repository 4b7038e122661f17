"""The run config's `tracking` block: the experiment tracker the learner mirrors its per-step
metrics, eval results and (redacted) run config to (learner/tracking/).

The run names the backend, the project and the tracker run's name; where the tracker lives (an
MLflow tracking URI, the W&B host and API key, the trackio folder or server) belongs to the
learner's host: its flags (`--tracking-*`, which also override these fields) and the tracker's
own environment variables, never the run config."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from protocol.config_base import Rule, _fail, _Strict

BACKENDS = ("wandb", "trackio", "mlflow")
Backend = Literal["wandb", "trackio", "mlflow"]
MAX_NAME = 128
MAX_TAGS = 20
MAX_TAG = 64


def _name(n: str) -> bool:
    return 1 <= len(n.strip()) and len(n) <= MAX_NAME


class TrackingConfig(_Strict):
    """Which tracker the learner mirrors to, and under which names."""

    backend: Backend = Field(
        description="wandb (Weights & Biases), trackio or mlflow; the learner needs the "
        "matching extra (pip install 'asyncgrpo[tracking-wandb]', …)."
    )
    project: str | None = Field(
        None,
        description="W&B project, trackio project or MLflow experiment (None: asyncgrpo).",
    )
    run_name: str | None = Field(
        None,
        description="Name of the tracker's run (None: the run's name and the first 8 "
        "characters of its id).",
    )
    entity: str | None = Field(
        None, description="W&B entity (team or user; None: the API key's default). W&B only."
    )
    tags: list[str] = Field(
        default_factory=list,
        description="Tags of the tracker's run (W&B tags, MLflow tags; trackio has none).",
    )

    RULES: ClassVar[dict[str, Rule]] = {
        "project": (_name, f"must be 1 to {MAX_NAME} characters"),
        "run_name": (_name, f"must be 1 to {MAX_NAME} characters"),
        "entity": (_name, f"must be 1 to {MAX_NAME} characters"),
        "tags": (
            lambda tags: len(tags) <= MAX_TAGS and all(1 <= len(t) <= MAX_TAG for t in tags),
            f"must be at most {MAX_TAGS} tags of 1 to {MAX_TAG} characters",
        ),
    }

    @field_validator("backend", mode="before")
    @classmethod
    def _known_backend(cls, value: Any) -> Any:
        if value not in BACKENDS:
            raise _fail(f"tracking.backend must be one of {', '.join(BACKENDS)} (got {value!r})")
        return value
