"""MLflow (extra `tracking-mlflow`: mlflow-skinny, the client without the server's pins).
Through MlflowClient (no global state): the experiment is spec.project, the run is found again
by its tag `asyncgrpo.run_id` after a restart, the config goes in as flat parameters. The
tracking URI is --tracking-uri, else MLFLOW_TRACKING_URI (a `file://` store also needs
MLFLOW_ALLOW_FILE_STORE=true, MLflow's own rule)."""

from __future__ import annotations

import re
import time
from typing import Any

from learner.tracking.base import Kind, flatten
from learner.tracking.spec import TrackerSpec

RUN_TAG = "asyncgrpo.run_id"
MAX_PARAMS = 100  # parameters per log_batch call (MLflow's limit)
MAX_PARAM_VALUE = 500  # characters kept of a parameter's value (the lowest of MLflow's limits)
_NOT_IN_NAME = re.compile(r"[^\w\-. :/]")  # what MLflow refuses in a parameter's name


class MlflowBackend:
    def __init__(self) -> None:
        self.client: Any = None
        self.run_id = ""

    def start(self, spec: TrackerSpec, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=spec.uri)
        experiment = self.client.get_experiment_by_name(spec.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(spec.project)
        )
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{spec.run_id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return  # its parameters are the same run config's (MLflow refuses changed values)
        tags = {RUN_TAG: spec.run_id, **dict.fromkeys(spec.tags, "")}
        run = self.client.create_run(experiment_id, run_name=spec.run_name, tags=tags)
        self.run_id = run.info.run_id
        params = [
            Param(_NOT_IN_NAME.sub("_", k)[:250], v[:MAX_PARAM_VALUE])
            for k, v in flatten(config).items()
        ]
        for i in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS])

    def log(self, kind: Kind, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now, step) for key, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        if self.client is not None and self.run_id:
            self.client.set_terminated(self.run_id)
