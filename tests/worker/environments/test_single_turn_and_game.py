"""`single_turn` (today's behaviour as a trajectory) and the `guess_number` game, with scripted
policies on the real SmolLM2 tokenizer."""

from __future__ import annotations

from typing import Any

from lm.chat import encode_prompt
from protocol.environments import EnvironmentConfig
from protocol.trajectories import validate_trajectory
from tests.worker.environments.scripted import ScriptedEngine, assert_token_exact, span_text
from worker.environments.guess_number import GuessNumberEnvironment, last_integer
from worker.environments.single_turn import SingleTurnEnvironment

PROMPT = [{"role": "user", "content": "What is 7 + 5?"}]


def test_single_turn_is_one_generation(small_tokenizer: Any) -> None:
    env = SingleTurnEnvironment(EnvironmentConfig(), small_tokenizer, max_model_len=1024)
    engine = ScriptedEngine(small_tokenizer, ["12"])
    t = env.rollout(engine, PROMPT, max_new_tokens=16)
    validate_trajectory(t, 1024)
    assert engine.inputs[0] == encode_prompt(small_tokenizer, PROMPT, None)  # as workers do today
    assert (t.stop_reason, [s.kind for s in t.spans], t.completion_text()) == (
        "done",
        ["prompt", "model"],
        "12",
    )
    assert_token_exact(t, engine)
    cut = env.rollout(
        ScriptedEngine(small_tokenizer, ["one two three four"]), PROMPT, max_new_tokens=2
    )
    assert (cut.stop_reason, cut.trained_tokens) == ("length", 2)


def bisect(low: int, high: int) -> Any:
    """A policy that reads the environment's answers in its input and halves the range."""

    def reply(text: str) -> str:
        lo, hi = low, high
        answers = text.split("<|im_start|>assistant\n")[1:]
        for turn in answers[:-1]:
            guess = last_integer(turn.split("<|im_end|>")[0])
            feedback = turn.split("<|im_start|>user\n")[-1]
            assert guess is not None
            if feedback.startswith("Higher"):
                lo = guess + 1
            elif feedback.startswith("Lower"):
                hi = guess - 1
        return f"My guess: {(lo + hi) // 2}"

    return reply


def test_guess_number_game(small_tokenizer: Any) -> None:
    config = EnvironmentConfig(name="guess_number", kwargs={"low": 1, "high": 1000}, max_turns=12)
    env = GuessNumberEnvironment(config, small_tokenizer, max_model_len=2048)
    engine = ScriptedEngine(small_tokenizer, [bisect(1, 1000)])
    t = env.rollout(engine, PROMPT, max_new_tokens=16, seed=3)
    validate_trajectory(t, 2048)
    assert t.stop_reason == "done" and t.info["found"] and t.info["guesses"][-1] == t.info["secret"]
    assert 2 <= t.model_turns <= 10  # bisection finds 1..1000 within 10 guesses
    answers = span_text(small_tokenizer, t, "environment")
    assert all(a.startswith("\n<|im_start|>user\n") for a in answers)
    assert all(("Higher." in a) != ("Lower." in a) for a in answers)
    assert_token_exact(t, engine)  # the environment's answers are untrained
    assert (
        env.rollout(
            ScriptedEngine(small_tokenizer, [bisect(1, 1000)]), PROMPT, max_new_tokens=16, seed=3
        ).token_ids
        == t.token_ids
    )  # seeded


def test_guess_number_asks_for_a_number_and_runs_out(small_tokenizer: Any) -> None:
    config = EnvironmentConfig(name="guess_number", max_turns=2)
    env = GuessNumberEnvironment(config, small_tokenizer, max_model_len=2048)
    t = env.rollout(ScriptedEngine(small_tokenizer, ["no idea"]), PROMPT, max_new_tokens=16)
    assert (t.stop_reason, t.model_turns, t.info["found"], t.info["guesses"]) == (
        "max_turns",
        2,
        False,
        [],
    )
    [answer] = span_text(small_tokenizer, t, "environment")
    assert "Answer with one whole number between 1 and 100." in answer
