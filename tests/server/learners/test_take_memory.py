"""The take with a memory payload (protocol/learner_memory.py `pool_fit`): a run too big for the
pool learner's budget beside the runs it holds is left, with the reason, and stays takeable by a
learner with more; held runs count, across takes and within one; a malformed payload is a 422
naming its field. Figures: tests/protocol/test_learner_memory.py works them out by hand for
the small model (SmolLM2-135M, bf16): one default run (LoRA r 16 on q, k, v, o, 4,096 tokens a
micro-batch) needs 4,557,495,424 B with the base weights and the overhead, a second one 29,491,200
B more; a run of r 8 on q, v with 8,192 tokens 7,794,351,232 B alone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.server.learner.support import make_run, run_row
from tests.server.learners.conftest import register

pytestmark = pytest.mark.timeout(120)

BIG = {
    "lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]},
    "grpo": {"micro_batch_tokens": 8192},
}


def memory(budget_gb: float, **fields: Any) -> dict[str, Any]:
    body = {
        "budget_gb": budget_gb,
        "weight_bytes": 2,
        "layers": 30,
        "hidden": 576,
        "intermediate": 1536,
        "heads": 9,
        "kv_heads": 3,
        "vocab": 49152,
        "tied_embeddings": True,
    }
    return body | fields


def take(client: Any, headers: dict[str, str], n: int, budget_gb: float) -> dict[str, Any]:
    body = {"max": n, "memory": memory(budget_gb)}
    response = client.post("/api/v1/learners/take", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def ids(answer: dict[str, Any]) -> list[uuid.UUID]:
    return [uuid.UUID(r["run_id"]) for r in answer["runs"]]


def test_a_run_too_big_is_left_with_the_reason_and_taken_by_a_bigger_learner(
    runs_app, runs_client
) -> None:
    big = make_run(runs_app, **BIG)  # the oldest: a take reads it first
    small = make_run(runs_app)
    _, five = register(runs_client, runs_app, name="five")
    answer = take(runs_client, five, 4, 5)
    assert ids(answer) == [small.id]
    # alone it needs 7,794,351,232 − 1,269,030,016 B beyond the base; 5 GB less the base left
    assert answer["left"] == [
        {"run_id": str(big.id), "reason": "needs 6.5 GB more, 3.7 GB left of the 5.0 GB budget"}
    ]
    assert run_row(runs_app, big.id).pool_learner_id is None
    eight_id, eight = register(runs_client, runs_app, name="eight")
    bigger = take(runs_client, eight, 4, 8)
    assert ids(bigger) == [big.id] and bigger["left"] == []
    assert run_row(runs_app, big.id).pool_learner_id == eight_id


def test_the_runs_held_count_across_takes_and_within_one(runs_app, runs_client) -> None:
    first, second = make_run(runs_app), make_run(runs_app)
    _, pool = register(runs_client, runs_app, name="tight")
    # 4.57 GB: one default run fits (4,557,495,424 B), a second does not (29,491,200 B more,
    # 12,504,576 B left)
    one = take(runs_client, pool, 1, 4.57)
    assert ids(one) == [first.id] and one["left"] == []
    reason = "needs 29 MB more beside the 1 run(s) it holds, 13 MB left of the 4.6 GB budget"
    again = take(runs_client, pool, 1, 4.57)
    assert again["runs"] == [] and again["left"] == [{"run_id": str(second.id), "reason": reason}]
    # a learner holding nothing takes it; and one take counts the run it took a moment before
    _, fresh = register(runs_client, runs_app, name="fresh")
    assert ids(take(runs_client, fresh, 1, 4.57)) == [second.id]
    third, fourth = make_run(runs_app), make_run(runs_app)
    _, both = register(runs_client, runs_app, name="both")
    answer = take(runs_client, both, 2, 4.57)
    assert ids(answer) == [third.id]
    assert answer["left"] == [{"run_id": str(fourth.id), "reason": reason}]


def test_without_memory_nothing_is_left(runs_app, runs_client) -> None:
    big = make_run(runs_app, **BIG)
    _, pool = register(runs_client, runs_app)
    response = runs_client.post("/api/v1/learners/take", json={"max": 1}, headers=pool)
    assert response.status_code == 200
    assert ids(response.json()) == [big.id] and response.json()["left"] == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (memory(-1), "memory.budget_gb"),
        (memory(0), "memory.budget_gb"),
        (memory(1e308), "memory.budget_gb"),
        (memory("x"), "memory.budget_gb"),  # type: ignore[arg-type]
        (memory(8, layers=0), "memory.layers"),
        (memory(8, layers=10**12), "memory.layers"),
        (memory(8, vocab="many"), "memory.vocab"),
        (memory(8, hidden=1.5), "memory.hidden"),
        (memory(8, kv_heads=2), "memory.kv_heads"),  # 2 does not divide 9 heads
        (memory(8, hidden=577), "memory.head_dim"),  # 9 heads do not divide 577
        (memory(8, head_dim=-64), "memory.head_dim"),
        (memory(8, weight_bytes=3), "memory.weight_bytes"),
        (memory(8, tied_embeddings=[]), "memory.tied_embeddings"),
        (memory(8, extra=1), "memory.extra"),
        ({k: v for k, v in memory(8).items() if k != "layers"}, "memory.layers"),
        ("16 GB", "memory"),
        ([16], "memory"),
    ],
)
def test_a_malformed_memory_payload_is_a_422_naming_its_field(
    runs_app, runs_client, payload: Any, field: str
) -> None:
    _, pool = register(runs_client, runs_app)
    response = runs_client.post(
        "/api/v1/learners/take", json={"max": 1, "memory": payload}, headers=pool
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "validation_failed"
    assert [e["field"] for e in body["errors"]] == [field]


def test_a_nan_budget_is_a_422(runs_app, runs_client) -> None:
    _, pool = register(runs_client, runs_app)
    text = '{"max": 1, "memory": {"budget_gb": NaN, "layers": 30, "hidden": 576, '
    text += '"intermediate": 1536, "heads": 9, "kv_heads": 3, "vocab": 49152}}'
    response = runs_client.post(
        "/api/v1/learners/take",
        content=text,
        headers={**pool, "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["memory.budget_gb"]
