"""The learner's attach on a `preparing` run waits (409 "preparing") instead of stopping, and
attaches once the run_prep job has made the run `pending`; it then parses the config it gets."""

from __future__ import annotations

import threading
import time
from typing import Any

from learner.config import LearnerSettings
from learner.loop import Learner
from protocol.client import AsyncGrpoClient
from protocol.rewards import RewardAllowlist
from protocol.run_config import LearnerRunConfig
from tests.server.datasets.files import QUESTIONS, jsonl, upload
from tests.server.learner.support import FP


def _learner(client: Any, run_id: str, token: str) -> Learner:
    """The real Learner's attach loop without loading a model (its tokenizer only gives the
    fingerprint, which the test sets)."""
    learner = Learner.__new__(Learner)
    learner.settings = LearnerSettings(
        server_url="http://testserver",
        run_id=run_id,
        token=token,
        model="smollm2-135m-instruct",
        standby_retry_s=0.05,
    )
    learner.client = AsyncGrpoClient("http://testserver", token, http=client)
    learner.fingerprint = FP
    learner.rewards_allowed = RewardAllowlist.discover([])
    learner.stopped = threading.Event()
    return learner


def test_the_learner_waits_while_the_run_prepares(ds_client, admin, run_jobs) -> None:  # type: ignore[no-untyped-def]
    dataset_id = upload(ds_client, admin, jsonl(QUESTIONS), "q.jsonl").json()["id"]
    spec = {"kind": "uploaded", "id": dataset_id, "prompt_column": "question"}
    body = {
        "name": "wait",
        "base_model": "smollm2-135m-instruct",
        "dataset": spec,
        "rewards": [{"name": "numeric_match"}],
    }
    created = ds_client.post("/api/v1/runs", json=body, headers=admin).json()
    learner = _learner(ds_client, created["run"]["id"], created["learner_token"])

    def prepare_later() -> None:
        time.sleep(0.5)
        run_jobs("datasets", "run_prep")

    preparer = threading.Thread(target=prepare_later)
    preparer.start()
    started = time.monotonic()
    attached = learner.attach()
    preparer.join()
    assert time.monotonic() - started >= 0.5  # it waited for the preparation
    config = LearnerRunConfig.model_validate(attached.run_config)
    assert config.dataset.model_dump(mode="json") == created["run"]["config"]["dataset"]
