"""`verifiers:<module>` environments through the in-process OpenAI-compatible client.

The environment module is tests/worker/environments/vf_standin.py: a STAND-IN that follows the
classic verifiers MultiTurnEnv interface (not the verifiers package, see its docstring)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from learner.env_check import check_trajectory
from protocol.environments import (
    EnvironmentAllowlist,
    EnvironmentConfig,
    declared_allows,
    worker_can_run,
)
from protocol.trajectories import validate_trajectory
from tests.worker.environments.scripted import ScriptedEngine, assert_token_exact
from worker.environments.base import EnvironmentSetupError
from worker.environments.registry import make_environment
from worker.environments.verifiers_env import (
    WORKER_SCORE,
    VerifiersEnvironment,
    VerifiersProtocolError,
)

MODULE = "tests.worker.environments.vf_standin"
NAME = f"verifiers:{MODULE}"
ALLOWED = EnvironmentAllowlist(frozenset({MODULE}))
PROMPT = [{"role": "user", "content": "Say one word."}]


def build(tokenizer: Any, **config: Any) -> VerifiersEnvironment:
    env = make_environment(
        EnvironmentConfig(name=NAME, **config), tokenizer, max_model_len=1024, allowed=ALLOWED
    )
    assert isinstance(env, VerifiersEnvironment)
    return env


def test_two_turns_are_token_exact(small_tokenizer: Any) -> None:
    env = build(small_tokenizer)
    engine = ScriptedEngine(small_tokenizer, ["apple", "apple"])
    t = env.rollout(engine, PROMPT, max_new_tokens=8)
    validate_trajectory(t, 1024)
    assert [s.kind for s in t.spans] == ["prompt", "model", "environment", "model"]
    assert_token_exact(t, engine)
    assert [(m.role, m.kind, m.content) for m in t.messages] == [
        ("user", "prompt", "Say one word."),
        ("assistant", "model", "apple"),
        ("user", "feedback", "Say the word again."),
        ("assistant", "model", "apple"),
    ]
    # the trajectory equals the whole conversation rendered once (ChatML)
    whole = [*PROMPT, *({"role": m.role, "content": m.content} for m in t.messages[1:])]
    rendered = small_tokenizer.apply_chat_template(whole, tokenize=False)
    assert small_tokenizer.decode(t.token_ids) == rendered.rstrip("\n")
    assert t.stop_reason == "done" and WORKER_SCORE not in t.info
    # the learner's env_mismatch check re-derives it from the transcript
    check_trajectory(t, small_tokenizer, env.config)


def test_worker_score_only_for_runs_requiring_trusted_workers(small_tokenizer: Any) -> None:
    trusted = build(small_tokenizer, requires_trusted_worker=True)
    same = trusted.rollout(ScriptedEngine(small_tokenizer, ["pear"]), PROMPT, max_new_tokens=8)
    other = trusted.rollout(
        ScriptedEngine(small_tokenizer, ["pear", "plum"]), PROMPT, max_new_tokens=8
    )
    assert (same.info[WORKER_SCORE], other.info[WORKER_SCORE]) == (1.0, 0.0)
    plain = build(small_tokenizer).rollout(
        ScriptedEngine(small_tokenizer, ["pear"]), PROMPT, max_new_tokens=8
    )
    assert WORKER_SCORE not in plain.info


def test_limits_end_the_rollout(small_tokenizer: Any) -> None:
    env = build(small_tokenizer, max_turns=1, requires_trusted_worker=True)
    engine = ScriptedEngine(small_tokenizer, ["fig"])
    t = env.rollout(engine, PROMPT, max_new_tokens=8)
    assert (t.stop_reason, t.model_turns) == ("max_turns", 1)
    assert WORKER_SCORE not in t.info  # the environment did not finish: nothing to score
    cut = build(small_tokenizer).rollout(
        ScriptedEngine(small_tokenizer, ["a b c d e f g h i j"], eos=False),
        PROMPT,
        max_new_tokens=4,
    )
    assert cut.stop_reason == "length"
    validate_trajectory(cut, 1024)


def test_rewritten_history_is_refused(small_tokenizer: Any) -> None:
    env = build(small_tokenizer, kwargs={"rewrite_history": True})
    with pytest.raises(VerifiersProtocolError, match="changed the conversation"):
        env.rollout(ScriptedEngine(small_tokenizer, ["kiwi"]), PROMPT, max_new_tokens=8)


def test_not_allowed_is_refused_and_not_imported(small_tokenizer: Any) -> None:
    sys.modules.pop(MODULE, None)
    with pytest.raises(EnvironmentSetupError, match="not allowed on this worker"):
        make_environment(EnvironmentConfig(name=NAME), small_tokenizer, max_model_len=1024)
    assert MODULE not in sys.modules
    other = EnvironmentAllowlist(frozenset({"tests.worker.environments.user_env"}))
    with pytest.raises(EnvironmentSetupError, match="not allowed on this worker"):
        make_environment(
            EnvironmentConfig(name=NAME), small_tokenizer, max_model_len=1024, allowed=other
        )
    assert MODULE not in sys.modules
    with pytest.raises(ValueError, match="standard library"):
        EnvironmentConfig(name="verifiers:os")
    with pytest.raises(EnvironmentSetupError, match="no load_environment"):
        make_environment(
            EnvironmentConfig(name="verifiers:tests.worker.environments.user_env"),
            small_tokenizer,
            max_model_len=1024,
            allowed=other,
        )


def test_grant_rule_for_verifiers_names() -> None:
    declared = ALLOWED.names()
    assert declared_allows(declared, NAME)
    assert not declared_allows(["single_turn"], NAME)
    needs_trust = EnvironmentConfig(name=NAME, requires_trusted_worker=True)
    assert not worker_can_run(needs_trust, declared, trusted=False)
    assert worker_can_run(needs_trust, declared, trusted=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("module", [MODULE, "tests.worker.environments.vf_package_env"])
def test_two_turns_on_the_real_model(tx_backend: Any, module: str) -> None:
    """End to end on the small model via the transformers backend (the stand-in, and the
    package's MultiTurnEnv when the extra is installed): every engine input is the trajectory's
    prefix, and the worker scores the rollout on a trusted-worker run."""
    from tests.worker.environments.test_backend_engine import Recording
    from worker.environments.backend_engine import BackendTurnEngine

    if module != MODULE:
        pytest.importorskip("verifiers.legacy", reason="the verifiers extra is not installed")
    env = make_environment(
        EnvironmentConfig(name=f"verifiers:{module}", requires_trusted_worker=True),
        tx_backend.tokenizer,
        max_model_len=1024,
        allowed=EnvironmentAllowlist(frozenset({module})),
    )
    engine = Recording(BackendTurnEngine(tx_backend, temperature=0.7, seed=3))
    t = env.rollout(engine, PROMPT, max_new_tokens=12)
    validate_trajectory(t, 1024)
    model_spans = [s for s in t.spans if s.kind == "model"]
    assert [t.token_ids[: s.start] for s in model_spans] == engine.inputs
    if t.stop_reason == "done":
        assert len(model_spans) == 2 and t.info[WORKER_SCORE] in (0.0, 1.0)
    else:  # the last turn hit max_new_tokens
        assert t.stop_reason == "length"
    check_trajectory(t, tx_backend.tokenizer, env.config)


def test_the_verifiers_package_multiturn_env(small_tokenizer: Any) -> None:
    """The package's own MultiTurnEnv loop (0.3.x State API) through the in-process client;
    skipped unless the `verifiers` extra is installed."""
    pytest.importorskip("verifiers.legacy", reason="the verifiers extra (0.3.x) is not installed")
    module = "tests.worker.environments.vf_package_env"
    allowed = EnvironmentAllowlist(frozenset({module}))
    env = make_environment(
        EnvironmentConfig(name=f"verifiers:{module}", requires_trusted_worker=True),
        small_tokenizer,
        max_model_len=1024,
        allowed=allowed,
    )
    assert isinstance(env, VerifiersEnvironment) and env.state_api
    for replies, score in ((["pear"], 1.0), (["pear", "plum"], 0.0)):
        engine = ScriptedEngine(small_tokenizer, list(replies))
        t = env.rollout(engine, PROMPT, max_new_tokens=8)
        validate_trajectory(t, 1024)
        assert [s.kind for s in t.spans] == ["prompt", "model", "environment", "model"]
        assert_token_exact(t, engine)
        check_trajectory(t, small_tokenizer, env.config)
        assert (t.stop_reason, t.info[WORKER_SCORE]) == ("done", score)
