"""Environments on the real small model through the transformers backend (token-in, token-out):
a multi-turn trajectory whose model-token log-probs equal a forward pass over the whole
trajectory (environment turns included as context) to the backend test's tolerance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from protocol.environments import EnvironmentConfig
from protocol.trajectories import validate_trajectory
from worker.environments.backend_engine import BackendTurnEngine
from worker.environments.base import Generated
from worker.environments.guess_number import GuessNumberEnvironment
from worker.environments.sandbox import ToolSandbox
from worker.environments.tool_calls import ToolCallsEnvironment

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
