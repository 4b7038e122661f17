"""The one interface every tracker adapter implements, and what they share."""

from __future__ import annotations

from typing import Any, Literal, Protocol

from learner.tracking.spec import TrackerSpec

Kind = Literal["train", "eval"]
# The x axis of each kind: the learner step for per-step metrics, the adapter version for
# eval results (eval batches of a version are scored after later steps have trained).
STEP_KEY = {"train": "train/step", "eval": "eval/version"}


class Backend(Protocol):
    """A tracker adapter. Its package is imported in `start`; every call may raise, and the
    Tracker turns mirroring off at the first exception."""

    def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
        """Open (or, after a restart, reopen) the tracker's run for spec.run_id, with the
        redacted run config."""

    def log(self, kind: Kind, step: int, values: dict[str, float]) -> None:
        """Record one point: `values` keyed `train/<metric>` or `eval/<metric>` at `step`."""

    def finish(self) -> None:
        """Send what is buffered and close the run."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → {"grpo.learning_rate": "0.0005", …} (for trackers whose parameters
    are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = "None" if value is None else str(value)
    return out
