"""Evaluation during training through the real API (SQLite and Postgres): eval leases at
versions 0, k, 2k and the final one, results per version, the evaluating status."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from server.db import transaction
from server.models import WebhookDelivery
from tests.conftest import make_settings
from tests.server.evals.support import (
    accurate,
    drain,
    make_eval_run,
    score_evals,
    worker_headers,
)
from tests.server.learner.support import attach, claim, make_worker, upload_and_publish


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_settings(db_url, tmp_path / "bucket")


def _expected(item_ids: list[int], n: int) -> dict[str, float]:
    right = [i for i in item_ids if accurate(i)]
    rewards = [1.0 if accurate(i) else 0.25 for i in item_ids]
    return {
        "accuracy": len(right) / len(item_ids),
        "pass_at_n": len(right) / len(item_ids),
        "mean_reward": sum(rewards) / len(rewards),
        "n_samples": len(item_ids) * n,
    }


def test_versions_zero_k_and_final_are_evaluated(app, client, admin_headers) -> None:
    run = make_eval_run(
        app, n_rows=10, alarms={"webhook_url": "http://127.0.0.1:9/hook"}
    )  # 5 versions of 2 prompts: due 0, 2, 4 and 5 (final)
    _, token = make_worker(app)
    worker = worker_headers(token)
    fencing = attach(client, run)["fencing"]
    queued = client.get(run.url("evals"), headers=admin_headers).json()
    assert [(v["version"], v["state"], v["n_prompts"]) for v in queued["versions"]] == [
        (0, "pending", 3)
    ]

    eval_leases: list[dict] = []
    items: dict[int, list[int]] = {}
    version = 0
    while True:
        leases = drain(client, worker)
        for lease in leases:
            if lease["kind"] == "eval":
                eval_leases.append(lease)
                items.setdefault(lease["adapter_version"], []).extend(
                    p["prompt_row_id"] for p in lease["prompts"]
                )
                assert lease["group_size"] == 2
                for prompt in lease["prompts"]:  # workers never see the reference columns
                    assert set(prompt) == {"prompt_row_id", "dataset_row_id", "prompt", "epoch"}
                assert lease["sampling"]["temperature"] == 0.7
                assert (lease["adapter"] is None) == (lease["adapter_version"] == 0)
        score_evals(client, run, fencing)
        body = claim(client, run, fencing, max_groups=2).json()
        assert all(b["n_groups"] == 2 for b in body["batches"])  # never an eval batch
        ids = [b["batch_id"] for b in body["batches"]]
        version += 1
        published = upload_and_publish(client, run, fencing, version, ids, final=body["exhausted"])
        assert published.status_code == 200, published.text
        if body["exhausted"]:
            assert published.json()["run_status"] == "evaluating"
            break
        assert version < 10
    assert version == 5

    # training is over: only eval leases, pinned to the final version
    leases = drain(client, worker)
    assert leases and {(x["kind"], x["adapter_version"]) for x in leases} == {("eval", 5)}
    for lease in leases:
        items.setdefault(5, []).extend(p["prompt_row_id"] for p in lease["prompts"])
    answers = score_evals(client, run, fencing)
    assert answers[-1]["run_status"] == "completed"
    assert client.get(run.url(""), headers=admin_headers).json()["status"] == "completed"

    got = client.get(run.url("evals"), headers=admin_headers).json()
    assert got["enabled"] and got["n"] == 2 and got["every_versions"] == 2
    assert [v["version"] for v in got["versions"]] == [0, 2, 4, 5]
    assert sorted(items) == [0, 2, 4, 5]
    for v in got["versions"]:
        assert v["state"] == "done" and v["scored_at"] is not None
        assert len(items[v["version"]]) == 3
        for key, value in _expected(items[v["version"]], 2).items():
            assert v[key] == pytest.approx(value), (v, key)
    with transaction(app.state.sessionmaker) as session:
        kinds = [
            d.payload["kind"]
            for d in session.execute(
                select(WebhookDelivery).where(WebhookDelivery.run_id == run.id)
            ).scalars()
        ]
    assert kinds.count("eval.scored") == 4  # every evaluated version reaches the webhook

    # /metrics: the latest evaluated version's figures
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
    }
    rid = (("run_id", str(run.id)),)
    final = got["versions"][-1]
    assert samples[("asyncgrpo_run_eval_version", rid)] == 5
    for name in ("accuracy", "mean_reward", "pass_at_n"):
        assert samples[(f"asyncgrpo_run_eval_{name}", rid)] == pytest.approx(final[name])
