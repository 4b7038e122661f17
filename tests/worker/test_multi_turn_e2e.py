"""A multi-turn (tool_calls) run through the real worker loop against a real control plane
(uvicorn subprocess, Postgres, local bucket) with the transformers backend and the real small
model: the worker declares its environments, rolls out prompt × G trajectories with the lease's
adapter version, writes a format 2 batch that the validating reader accepts; a prompt that
leaves no room for a model turn is released `prompt_too_long` and dropped after max_attempts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lm.chat import chat_messages, tokenizer_fingerprint
from lm.chat_turns import prompt_ids
from protocol.batches import BatchExpectations, read_trajectories
from protocol.environments import EnvironmentConfig
from tests.worker.harness import SYSTEM_PROMPT, LoopThread, Stack, worker_settings
from worker.environments.tools import BUILTIN_TOOLS, fallback_instructions, with_instructions
from worker.loop import Outcome

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres]

TOOLS = {"name": "tool_calls", "tools": ["calculator"], "max_turns": 2, "max_total_tokens": 400}
MAX_NEW = 24


def _tiny(**environment: Any) -> dict[str, Any]:
    return {
        "environment": {**TOOLS, **environment},
        "group_size": 2,
        "prompts_per_lease": 1,
        "prompts_per_step": 1,
        "sampling": {"temperature": 1.0, "max_new_tokens": MAX_NEW},
    }


def _learner_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """The prompt as the learner renders it for a template without a tool format (SmolLM2):
    the fallback tool instructions in the system message."""
    tools = [BUILTIN_TOOLS["calculator"]]
    messages = with_instructions(chat_messages(prompt, SYSTEM_PROMPT), fallback_instructions(tools))
    return prompt_ids(tokenizer, messages)


@pytest.mark.timeout(600)
def test_tool_calls_lease_writes_a_trajectory_batch(
    make_stack: Callable[..., Stack], tx_backend: Any, small_tokenizer: Any, tmp_path: Path
) -> None:
    stack = make_stack(1, **_tiny())
    settings = worker_settings(stack, tmp_path, max_leases=1)
    worker = LoopThread(settings, tx_backend).start()
    worker.join(500)
    (record,) = worker.loop.history
    assert record.outcome == Outcome.accepted, record.reason
    declared = stack.server.sql("SELECT environments FROM workers")[0].environments
    assert {"single_turn", "tool_calls", "guess_number"} <= set(declared)

    (row,) = stack.batch_rows()
    (prompt,) = stack.batch_prompts(row.id)
    env = EnvironmentConfig.model_validate(TOOLS)
    expect = BatchExpectations(
        run_id=stack.run_id,
        lease_id=str(record.lease_id),
        fencing=row.fencing,
        worker_id=str(worker.loop.worker_id),
        adapter_version=0,
        adapter_sha256=None,
        tokenizer_fingerprint=tokenizer_fingerprint(small_tokenizer),
        prompt_row_ids=[prompt.id],
        group_size=2,
        vocab_size=len(small_tokenizer),
        max_new_tokens=MAX_NEW,
        sha256=row.sha256,
        prompt_token_ids={prompt.id: _learner_prompt(small_tokenizer, prompt.prompt)},
        environment=env,
    )
    batch = read_trajectories(tmp_path / "bucket" / row.bucket_key, expect)
    assert batch.format_version == 2 and batch.n_samples == row.n_samples == 2
    for r in batch.rows:
        assert r.spans[0].kind == "prompt" and r.spans[-1].kind in ("model", "environment")
        assert 1 <= r.model_turns <= 2 and len(r.token_ids) <= 400
        assert r.messages is not None and r.messages[-1].kind in ("model", "tool_result",
                                                                  "tool_error")  # fmt: skip
        assert r.trained_tokens == sum(s.end - s.start for s in r.spans if s.kind == "model")
        assert r.stop_reason in ("done", "length", "max_turns", "token_budget", "tool_timeout")
    assert batch.n_tokens == record.n_tokens  # the manifest counts model tokens


@pytest.mark.timeout(300)
def test_a_prompt_too_long_for_the_budget_is_released_and_dropped(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    stack = make_stack(1, max_attempts=1, **_tiny(max_total_tokens=40))
    settings = worker_settings(stack, tmp_path, max_leases=1)
    worker = LoopThread(settings, tx_backend).start()
    worker.join(200)
    (record,) = worker.loop.history
    assert record.outcome == Outcome.released
    assert record.reason is not None and record.reason.startswith("prompt_too_long")
    rows = stack.server.sql("SELECT state, drop_reason FROM prompt_rows")
    assert [(r.state, r.drop_reason) for r in rows] == [("dropped", "prompt_too_long_exhausted")]


@pytest.mark.timeout(300)
def test_an_environment_this_engine_cannot_hold_is_released_unservable(
    make_stack: Callable[..., Stack], tx_backend: Any, tmp_path: Path
) -> None:
    too_big = tx_backend.max_model_len + 1
    stack = make_stack(1, **_tiny(max_total_tokens=too_big))
    settings = worker_settings(stack, tmp_path, max_leases=1)
    worker = LoopThread(settings, tx_backend).start()
    worker.join(200)
    (record,) = worker.loop.history
    assert record.outcome == Outcome.released
    assert record.reason is not None and "max_model_len" in record.reason
    (lease,) = stack.lease_rows()
    assert lease.end_reason == "unservable"
    assert stack.prompt_states() == {"queued": 1}  # no attempt counted: another worker may
