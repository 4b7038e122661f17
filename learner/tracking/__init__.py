"""Mirror the learner's per-step metrics, eval results and redacted run config to an
experiment tracker (W&B, trackio or MLflow), as optional extras
(docs/guides/trackers.md).

`Tracker` is the one object the learner owns (rank 0 only): it resolves the backend from the
learner's flags and the run config's `tracking` block (flags win), redacts the config, and
hands every call to a background thread, so a slow or failing tracker never stalls or stops
training: the first failure logs a warning and turns mirroring off for the process. Each
backend is a small adapter behind `Backend` (base.py); its package is imported only there."""

from learner.tracking.tracker import Tracker

__all__ = ["Tracker"]
