"""Which tracker, under which names: the learner's flags over the run config's `tracking`."""

from __future__ import annotations

from dataclasses import dataclass

from learner.config import LearnerSettings
from protocol.tracking import TrackingConfig

DEFAULT_PROJECT = "asyncgrpo"


@dataclass(frozen=True)
class TrackerSpec:
    """A resolved tracker: the backend and the names of the tracker's project and run."""

    backend: str
    project: str
    run_name: str
    run_id: str  # the asyncgrpo run's id: a restarted learner finds the same tracker run by it
    entity: str | None = None
    tags: tuple[str, ...] = ()
    uri: str | None = None  # MLflow tracking URI (learner flag only)


def resolve(
    settings: LearnerSettings, block: TrackingConfig | None, run_id: str, run_name: str
) -> TrackerSpec | None:
    """The tracker this learner mirrors to, or None. Each `--tracking-*` flag (or its
    ASYNCGRPO_LEARNER_TRACKING_* variable) that is set wins over the block's field;
    `--tracking-backend none` turns tracking off whatever the run config says."""
    backend = settings.tracking_backend or (block.backend if block else None)
    if backend is None or backend == "none":
        return None
    project = settings.tracking_project or (block.project if block else None)
    name = settings.tracking_run_name or (block.run_name if block else None)
    return TrackerSpec(
        backend=backend,
        project=project or DEFAULT_PROJECT,
        run_name=name or f"{run_name}-{run_id[:8]}",
        run_id=run_id,
        entity=settings.tracking_entity or (block.entity if block else None),
        tags=tuple(block.tags) if block else (),
        uri=settings.tracking_uri,
    )
