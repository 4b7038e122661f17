"""The learner's intake of format 2 batches: trajectories rolled out by the real `tool_calls`
environment (a scripted policy on the real SmolLM2 tokenizer, the real tool sandbox), written
by the real batch writer and read by `Intake.load`: groups carry the loss mask, rewards get the
model's text, the transcript and `info`; a doctored tool result is rejected `env_mismatch`."""

from __future__ import annotations

import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from learner.intake import Intake
from lm.chat import chat_messages, tokenizer_fingerprint
from protocol.batches import BatchMetadata, BatchRejected, TrajectorySample, write_trajectory_batch
from protocol.layout import batch_key
from protocol.rewards import RewardAllowlist
from protocol.run_config import RunConfig
from protocol.schemas_learner import ClaimedBatch, PromptRowOut
from protocol.trajectories import Trajectory
from tests.harness.runs import jsonl, run_config
from tests.learner.test_env_check import PRODUCT, call, doctor
from tests.worker.environments.scripted import ScriptedEngine
from worker.environments.sandbox import ToolSandbox
from worker.environments.tool_calls import ToolCallsEnvironment

RUN, LEASE, WORKER = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
PROMPTS = {11: "What is 123456789 * 987654321?", 12: "Multiply 123456789 by 987654321."}
REPLIES = {  # per sample of a group: one calls the calculator, one answers at once
    0: [call("123456789 * 987654321"), f"It is {PRODUCT}."],
    1: ["I don't know."],
}


def _config() -> RunConfig:
    return RunConfig.model_validate(
        run_config(
            name="trajectories",
            dataset=jsonl([{"prompt": "p", "answer": "1"}]),
            rewards=[{"name": "tests.learner.rewards_for_tests:transcript_score"}],
            environment={
                "name": "tool_calls",
                "tools": ["calculator"],
                "max_turns": 3,
                "max_total_tokens": 1024,
            },
            sampling={"max_new_tokens": 96},
        )
    )


@pytest.fixture(scope="module")
def trajectories(small_tokenizer: Any) -> Iterator[dict[tuple[int, int], Trajectory]]:
    env_config = _config().environment
    out = {}
    with ToolSandbox(memory_mb=256) as sandbox:
        env = ToolCallsEnvironment(env_config, small_tokenizer, max_model_len=2048, sandbox=sandbox)
        for row, prompt in PROMPTS.items():
            for g, replies in REPLIES.items():
                engine = ScriptedEngine(small_tokenizer, list(replies))
                messages = chat_messages(prompt, _config().grpo.system_prompt)
                out[row, g] = env.rollout(engine, messages, max_new_tokens=96)
    yield out


def _claim(
    tmp_path: Path, small_tokenizer: Any, ts: dict[tuple[int, int], Trajectory]
) -> tuple[ClaimedBatch, Path]:
    config = _config()
    meta = BatchMetadata(
        format_version=2,
        run_id=str(RUN),
        lease_id=str(LEASE),
        fencing=1,
        worker_id=str(WORKER),
        adapter_version=0,
        adapter_sha256=None,
        tokenizer_fingerprint=tokenizer_fingerprint(small_tokenizer),
        sampling={"temperature": 1.0},
        environment=config.environment.model_dump(mode="json"),
    )
    path = tmp_path / "upload.parquet"
    samples = [TrajectorySample(row, g, t) for (row, g), t in ts.items()]
    info = write_trajectory_batch(path, meta, samples)
    batch = ClaimedBatch(
        batch_id=uuid.uuid4(),
        lease_id=LEASE,
        worker_id=WORKER,
        adapter_version=0,
        staleness=0,
        target_version=1,
        bucket_key=batch_key(RUN, LEASE, 1),
        sha256=info.sha256,
        size=info.bytes,
        url="file://upload",
        n_samples=len(samples),
        n_groups=len(PROMPTS),
        prompts=[
            PromptRowOut(
                prompt_row_id=row,
                dataset_row_id=row,
                prompt=prompt,
                reference={"answer": PRODUCT},
                epoch=0,
            )
            for row, prompt in PROMPTS.items()
        ],
    )
    return batch, path


@pytest.fixture
def intake(tmp_path: Path, small_tokenizer: Any) -> Iterator[Intake]:
    source = tmp_path / "upload.parquet"

    def download(_url: str, dest: Path, _sha: str | None) -> int:
        shutil.copyfile(source, dest)
        return dest.stat().st_size

    with Intake(
        run_id=str(RUN),
        config=_config(),
        tokenizer=small_tokenizer,
        fingerprint=tokenizer_fingerprint(small_tokenizer),
        work_dir=tmp_path / "work",
        download=download,
        rewards_allowed=RewardAllowlist(modules=("tests.learner.rewards_for_tests",)),
    ) as it:
        yield it


def test_an_honest_batch_trains_on_model_tokens_with_transcript_rewards(
    tmp_path: Path, small_tokenizer: Any, intake: Intake, trajectories: Any
) -> None:
    batch, _ = _claim(tmp_path, small_tokenizer, trajectories)
    result = intake.load(batch)
    assert [r.prompt_row_id for r in result.data.rows] == [11, 11, 12, 12]
    # sample 0: one tool result seen, the answer in its text, info given; sample 1: neither
    assert result.rewards_by_name["tests.learner.rewards_for_tests:transcript_score"] == [
        111.0,
        100.0,
        111.0,
        100.0,
    ]
    called = result.groups[0].completions[0]
    t = trajectories[11, 0]
    assert list(called.prompt_ids) == t.token_ids[: t.prompt_tokens]
    assert list(called.loss_mask or []) == t.loss_mask[t.prompt_tokens :]
    assert 0 in (called.loss_mask or []) and called.model_tokens == t.trained_tokens
    text = intake.model_text(result.data.rows[0])
    assert text.startswith("<tool_call>") and text.endswith(f"It is {PRODUCT}.")


def test_a_doctored_tool_result_rejects_the_batch_env_mismatch(
    tmp_path: Path, small_tokenizer: Any, intake: Intake, trajectories: Any
) -> None:
    ts = dict(trajectories)
    wrong = str(int(PRODUCT) + 10**6)
    ts[12, 0] = doctor(small_tokenizer, ts[12, 0], PRODUCT, wrong, tokens=True)
    batch, _ = _claim(tmp_path, small_tokenizer, ts)
    with pytest.raises(BatchRejected) as info:
        intake.load(batch)
    assert info.value.reason == "env_mismatch"
    assert "row 2 (prompt 12, sample 0)" in info.value.detail
    assert PRODUCT in info.value.detail


def test_a_changed_prompt_message_rejects_the_batch_env_mismatch(
    tmp_path: Path, small_tokenizer: Any, intake: Intake, trajectories: Any
) -> None:
    """The transcript's prompt rendered to the prompt span, but it is not the row's prompt."""
    with ToolSandbox(memory_mb=256) as sandbox:
        env = ToolCallsEnvironment(
            _config().environment, small_tokenizer, max_model_len=2048, sandbox=sandbox
        )
        other = env.rollout(
            ScriptedEngine(small_tokenizer, ["No."]),
            chat_messages("What is 2 + 2?", _config().grpo.system_prompt),
            max_new_tokens=96,
        )
    ts = dict(trajectories)
    ts[11, 0] = ts[11, 1] = other  # a whole group answering another prompt
    batch, _ = _claim(tmp_path, small_tokenizer, ts)
    with pytest.raises(BatchRejected) as info:
        intake.load(batch)
    assert info.value.reason == "env_mismatch"
    assert "row 0 (prompt 11, sample 0): the transcript's prompt messages" in info.value.detail


@pytest.mark.parametrize(
    ("environment", "multi_turn"),
    [
        ({"name": "guess_number", "max_turns": 3, "max_total_tokens": 300}, True),
        # random tokens never call a tool: this checks the prompt with the fallback instructions
        (
            {
                "name": "tool_calls",
                "tools": ["calculator"],
                "max_turns": 3,
                "max_total_tokens": 300,
            },
            False,
        ),
    ],
)
def test_the_workers_rollouts_pass_the_environment_check(
    environment: dict[str, Any], multi_turn: bool, small_tokenizer: Any
) -> None:
    """Trajectories as worker/rollouts.py writes them for a lease (the simulated backend: real
    tokenizer, sampled token ids) pass the learner's checks with the row's own prompt."""
    from learner.env_check import check_trajectory
    from learner.intake import _check_prompt_messages, as_trajectory
    from protocol.batch_reader import TrajectoryRecord
    from protocol.environments import BUILTINS_ONLY, EnvironmentConfig
    from tests.worker.test_rollouts import SYSTEM, CountingBackend, lease
    from worker.rollouts import EnvironmentRollouts

    the_lease = lease(environment)
    backend = CountingBackend()
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    try:
        samples = rollouts.rollout(the_lease, None, threading.Event())
    finally:
        rollouts.close()
        backend.close()
    config = EnvironmentConfig(**environment)
    prompts = {p.prompt_row_id: p.prompt for p in the_lease.prompts}
    assert any(s.trajectory.model_turns > 1 for s in samples) == multi_turn
    for s in samples:
        t = s.trajectory
        record = TrajectoryRecord(
            prompt_row_id=s.prompt_row_id,
            group_index=s.group_index,
            token_ids=t.token_ids,
            loss_mask=t.loss_mask,
            logprobs=t.logprobs,
            spans=t.spans,
            messages=t.messages,
            stop_reason=t.stop_reason,
            tool_calls=t.tool_calls,
            tool_errors=t.tool_errors,
            info=t.info,
        )
        _check_prompt_messages(record, chat_messages(prompts[s.prompt_row_id], SYSTEM))
        check_trajectory(as_trajectory(record), small_tokenizer, config)
