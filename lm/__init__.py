"""Torch code shared by the worker and the learner: model resolution, chat templates,
per-token log-probs, adapter folders. The one home of this code
(docs/architecture/index.md, "Processes and imports"); `protocol` stays torch-free and `lm` never
imports `server`."""
