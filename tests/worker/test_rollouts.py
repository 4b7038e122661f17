"""worker/rollouts.py with the simulated backend (real tokenizer, no model): a multi-turn lease
rolled out prompt × G into trajectories that write a format 2 batch the validating reader
accepts; a cancel between or during turns stops every trajectory; prompts too long for the
budget are named; a budget above the engine's max_model_len cannot be set up."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from lm.chat import chat_messages
from lm.chat_turns import prompt_ids
from protocol.batch_format import BatchMetadata
from protocol.batches import BatchExpectations, read_trajectories, write_trajectory_batch
from protocol.environments import BUILTINS_ONLY, EnvironmentAllowlist, EnvironmentConfig
from protocol.schemas import Lease, LeasePrompt
from worker.backends.base import Completion, GenerationCancelled, SamplingSpec
from worker.backends.simulated import SimulatedBackend
from worker.config import SimulatedSettings
from worker.environments.base import Environment, EnvironmentSetupError
from worker.rollouts import EnvironmentRollouts, PromptsTooLong, RolloutFailed, is_multi_turn

MODEL = "smollm2-135m-instruct"
GAME = {"name": "guess_number", "max_turns": 3, "max_total_tokens": 300}
SYSTEM = "You are a helpful assistant."


class CountingBackend(SimulatedBackend):
    """Counts generate calls; sets `cancel_after` calls' cancel event (an abort mid-rollout)."""

    def __init__(self, cancel_after: int | None = None) -> None:
        settings = {"step_s": 0.0005, "prefill_s_per_token": 0.0, "mean_completion_tokens": 4}
        super().__init__(MODEL, SimulatedSettings.model_validate(settings))
        self.calls = 0
        self.cancel_after = cancel_after
        self.lock = threading.Lock()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: Any,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        with self.lock:
            self.calls += 1
            if self.cancel_after is not None and self.calls >= self.cancel_after and cancel:
                cancel.set()
        return super().generate(prompts, group_size, sampling, adapter, cancel)


@pytest.fixture
def backend() -> Iterator[CountingBackend]:
    b = CountingBackend()
    yield b
    b.close()


def lease(environment: dict[str, Any] | None, n_prompts: int = 2, group: int = 3) -> Lease:
    lease_id = uuid.uuid4()
    return Lease(
        lease_id=lease_id,
        run_id=uuid.uuid4(),
        base_model=MODEL,
        tokenizer_fingerprint=None,
        sampling={"temperature": 1.0, "max_new_tokens": 8},
        max_new_tokens=8,
        system_prompt=SYSTEM,
        group_size=group,
        prompts=[
            LeasePrompt(prompt_row_id=100 + i, dataset_row_id=i, prompt=f"Guess {i}", epoch=0)
            for i in range(n_prompts)
        ],
        seed=42,
        adapter_version=0,
        fencing=1,
        ttl_s=30.0,
        heartbeat_interval_s=5.0,
        batch_key="k",
        environment=None if environment is None else EnvironmentConfig(**environment).model_dump(),
    )


def test_single_turn_leases_keep_todays_path() -> None:
    assert not is_multi_turn(lease(None)) and not is_multi_turn(lease({"name": "single_turn"}))
    assert is_multi_turn(lease(GAME))


def test_a_lease_rolls_out_into_a_valid_trajectory_batch(
    backend: CountingBackend, tmp_path: Path
) -> None:
    the_lease = lease(GAME)
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    try:
        samples = rollouts.rollout(the_lease, None, threading.Event())
    finally:
        rollouts.close()
    assert [(s.prompt_row_id, s.group_index) for s in samples] == [
        (100 + i, g) for i in range(2) for g in range(3)
    ]
    # the G trajectories of a prompt play the same game (environment seed per prompt)
    secrets = {(s.prompt_row_id, s.trajectory.info["secret"]) for s in samples}
    assert len(secrets) == 2
    env = EnvironmentConfig(**GAME)
    meta = BatchMetadata(
        format_version=2,
        run_id=str(the_lease.run_id),
        lease_id=str(the_lease.lease_id),
        fencing=1,
        worker_id=str(uuid.uuid4()),
        adapter_version=0,
        adapter_sha256=None,
        tokenizer_fingerprint="f",
        sampling=the_lease.sampling,
        environment=env.model_dump(mode="json"),
    )
    info = write_trajectory_batch(tmp_path / "b.parquet", meta, samples)
    tok = backend.tokenizer
    expect = BatchExpectations(
        run_id=meta.run_id,
        lease_id=meta.lease_id,
        fencing=1,
        worker_id=meta.worker_id,
        adapter_version=0,
        adapter_sha256=None,
        tokenizer_fingerprint="f",
        prompt_row_ids=[100, 101],
        group_size=3,
        vocab_size=len(tok),
        max_new_tokens=8,
        sha256=info.sha256,
        environment=env,
    )
    batch = read_trajectories(tmp_path / "b.parquet", expect)
    assert batch.n_samples == 6 and batch.n_tokens == info.n_tokens
    for row in batch.rows:
        assert row.messages is not None and row.messages[0].kind == "prompt"
        assert row.model_turns <= 3


def test_an_abort_during_the_rollout_stops_every_trajectory() -> None:
    backend = CountingBackend(cancel_after=2)
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    try:
        with pytest.raises(GenerationCancelled):
            rollouts.rollout(lease({**GAME, "max_turns": 8}), None, threading.Event())
    finally:
        rollouts.close()
        backend.close()
    # 6 trajectories × up to 8 turns without the abort; with it, no new turn starts
    assert backend.calls <= 6


def test_prompts_too_long_are_named(backend: CountingBackend) -> None:
    prompt_len = len(prompt_ids(backend.tokenizer, chat_messages("Guess 0", SYSTEM)))
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    try:
        with pytest.raises(PromptsTooLong) as info:
            rollouts.rollout(
                lease({**GAME, "max_total_tokens": prompt_len}), None, threading.Event()
            )
    finally:
        rollouts.close()
    assert info.value.prompt_row_ids == [100, 101]


def test_a_budget_above_the_engine_cannot_be_set_up(backend: CountingBackend) -> None:
    too_big = backend.max_model_len + 1
    rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)
    with pytest.raises(EnvironmentSetupError, match="max_model_len"):
        rollouts.rollout(lease({**GAME, "max_total_tokens": too_big}), None, threading.Event())
    rollouts.close()


class Broken(Environment):
    """A user environment whose rollout raises (a bug in operator-allowed code)."""

    name = "broken"

    def rollout(self, engine: Any, prompt_messages: Any, *, max_new_tokens: int, seed: int = 0):  # type: ignore[no-untyped-def]
        raise KeyError("the environment's own bug")


@pytest.mark.integration  # the tool sandbox's child
def test_a_failing_environment_is_a_rollout_failure(backend: CountingBackend) -> None:
    allowed = EnvironmentAllowlist(modules=frozenset({__name__}))
    rollouts = EnvironmentRollouts(backend, allowed=allowed)
    try:
        with pytest.raises(RolloutFailed, match="KeyError"):
            rollouts.rollout(lease({"name": f"{__name__}:Broken"}), None, threading.Event())
    finally:
        rollouts.close()
