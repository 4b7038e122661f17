"""Environments on the real small model through the transformers backend (token-in, token-out):
a multi-turn trajectory whose model-token log-probs equal a forward pass over the whole
trajectory (environment turns included as context) to the backend test's tolerance."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from protocol.environments import BUILTINS_ONLY, EnvironmentConfig
from protocol.schemas import Lease, LeasePrompt
from protocol.trajectories import validate_trajectory
from worker.adapters import AdapterHandle
from worker.environments.backend_engine import BackendTurnEngine
from worker.environments.base import Generated
from worker.environments.guess_number import GuessNumberEnvironment
from worker.environments.sandbox import ToolSandbox
from worker.environments.tool_calls import ToolCallsEnvironment
from worker.rollouts import EnvironmentRollouts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

T = 0.7
MEAN_TOL, MAX_TOL = 1e-4, 1e-3


class Recording:
    def __init__(self, engine: BackendTurnEngine) -> None:
        self.engine = engine
        self.inputs: list[list[int]] = []

    def generate(self, token_ids: Sequence[int], max_new_tokens: int) -> Generated:
        self.inputs.append(list(token_ids))
        return self.engine.generate(token_ids, max_new_tokens)


def forward_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log_softmax(logits / T) of each token given the ones before it (index 0: nan)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    scaled = torch.log_softmax(logits[:-1] / T, dim=-1)
    picked = scaled.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    return [float("nan"), *picked.tolist()]


def test_guess_game_on_the_real_model(tx_backend: Any) -> None:
    config = EnvironmentConfig(name="guess_number", kwargs={"low": 1, "high": 10**6}, max_turns=3)
    env = GuessNumberEnvironment(config, tx_backend.tokenizer, max_model_len=1024)
    engine = Recording(BackendTurnEngine(tx_backend, temperature=T, seed=11))
    prompt = [{"role": "user", "content": "Let's play. Your first guess?"}]
    t = env.rollout(engine, prompt, max_new_tokens=12, seed=5)
    validate_trajectory(t, 1024)
    assert t.model_turns >= 2 and "environment" in [s.kind for s in t.spans]
    model_spans = [s for s in t.spans if s.kind == "model"]
    assert [t.token_ids[: s.start] for s in model_spans] == engine.inputs
    recomputed = forward_logprobs(tx_backend.model, t.token_ids)
    diffs = [abs(recomputed[i] - lp) for i, lp in enumerate(t.logprobs) if lp is not None]
    assert len(diffs) == t.trained_tokens
    assert sum(diffs) / len(diffs) < MEAN_TOL and max(diffs) < MAX_TOL


def test_tool_calls_on_the_real_model(tx_backend: Any) -> None:
    """Whatever the small model writes (an answer, a call, a malformed call), the rollout
    ends with a reason and a valid trajectory."""
    config = EnvironmentConfig(name="tool_calls", tools=["calculator"], max_turns=2)
    prompt = [{"role": "user", "content": "Use the calculator: what is 1234 * 5678?"}]
    with ToolSandbox() as sandbox:
        env = ToolCallsEnvironment(
            config, tx_backend.tokenizer, max_model_len=1024, sandbox=sandbox
        )
        for seed in range(2):
            engine = BackendTurnEngine(tx_backend, temperature=T, seed=seed)
            t = env.rollout(engine, prompt, max_new_tokens=40)
            validate_trajectory(t, 1024)
            assert t.stop_reason in ("done", "length", "max_turns")


class PushBetweenTurns:
    """The worker's backend, where a newer version of the run is pushed after the first turn
    of a rollout: v2 is loaded (as the version feed does) and another lease generates with it,
    so v2 takes the backend's only adapter slot (max_loaded_adapters=1) between two turns."""

    def __init__(self, backend: Any, newer: AdapterHandle) -> None:
        self.backend = backend
        self.newer = newer
        self.tokenizer = backend.tokenizer
        self.max_model_len = backend.max_model_len
        self.versions: list[int] = []
        self.slots_after_push: list[tuple[str, int]] = []

    def generate(
        self, prompts: Any, group_size: int, sampling: Any, adapter: Any, cancel: Any = None
    ) -> Any:
        self.versions.append(adapter.version if adapter is not None else 0)
        out = self.backend.generate(prompts, group_size, sampling, adapter, cancel)
        if len(self.versions) == 1:
            self.backend.load_adapter(self.newer)
            self.backend.generate(prompts, 1, sampling, self.newer)
            self.slots_after_push = list(self.backend.loaded_adapters)
        return out


def test_one_trajectory_keeps_its_version_when_a_newer_one_is_pushed(
    tx_backend: Any, small_model: Any, adapter_dirs: dict[int, Path]
) -> None:
    """A guess_number lease of v1 rolled out by the worker's EnvironmentRollouts while v2 is
    pushed (and used) between its turns: every turn is generated with v1, and the log-probs
    of the turns after the push are v1's (a forward pass of the base model with v1's adapter
    over the whole trajectory), not v2's."""
    from peft import PeftModel

    handles = {v: AdapterHandle(RUN, v, f"sha{v}", adapter_dirs[v]) for v in (1, 2)}
    for seed in range(40, 48):  # the first lease whose trajectory has two model turns
        backend = PushBetweenTurns(tx_backend, handles[2])
        rollouts = EnvironmentRollouts(backend, allowed=BUILTINS_ONLY)  # type: ignore[arg-type]
        the_lease = lease(seed)
        try:
            [sample] = rollouts.rollout(the_lease, handles[1], threading.Event())
        finally:
            rollouts.close()
        if sample.trajectory.model_turns >= 2:
            break
    t = sample.trajectory
    assert t.model_turns >= 2, "no two-turn game in 8 seeds"
    assert backend.versions == [1] * t.model_turns  # every turn asked for v1
    assert backend.slots_after_push == [(RUN, 2)]  # v2 held the only slot after the first turn
    after_push = [
        i for s in [s for s in t.spans if s.kind == "model"][1:] for i in range(s.start, s.end)
    ]

    def gaps(version: int) -> list[float]:
        model = PeftModel.from_pretrained(copy.deepcopy(small_model), str(adapter_dirs[version]))
        recomputed = forward_logprobs(model.eval(), t.token_ids)
        return [abs(recomputed[i] - float(t.logprobs[i])) for i in after_push]  # type: ignore[arg-type]

    own = gaps(1)
    assert sum(own) / len(own) < MEAN_TOL and max(own) < MAX_TOL, max(own)
    assert max(gaps(2)) > 100 * MAX_TOL  # v2 would have given other log-probs


RUN = "00000000-0000-0000-0000-000000000001"


def lease(seed: int) -> Lease:
    return Lease(
        lease_id=uuid.uuid4(),
        run_id=uuid.UUID(RUN),
        base_model="smollm2-135m-instruct",
        tokenizer_fingerprint=None,
        sampling={"temperature": T, "max_new_tokens": 12},
        max_new_tokens=12,
        system_prompt="You are a helpful assistant.",
        group_size=1,
        prompts=[
            LeasePrompt(
                prompt_row_id=1, dataset_row_id=0, prompt="Let's play. Your first guess?", epoch=0
            )
        ],
        seed=seed,
        adapter_version=1,
        adapter=None,
        fencing=1,
        ttl_s=30.0,
        heartbeat_interval_s=5.0,
        batch_key="k",
        environment=EnvironmentConfig(
            name="guess_number", kwargs={"low": 1, "high": 10**6}, max_turns=3
        ).model_dump(),
    )
