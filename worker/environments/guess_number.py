"""`guess_number`: a small multi-turn game for tests and demos.

The environment picks a whole number in [low, high] (from the rollout's seed) and adds the rules
to the prompt's system message. Each model turn is read for its last integer: the environment
answers "higher" or "lower" as a user turn (or asks for a number when there is none), and the
trajectory ends `done` when the guess is right. `info` tells rewards the secret, whether it was
found and the guesses made.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from protocol.environments import check_guess_kwargs
from protocol.trajectories import StopReason, Trajectory, TranscriptMessage
from worker.environments.base import Conversation, Environment, TurnEngine, cut_reason
from worker.environments.tools import with_instructions

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.environments import EnvironmentConfig
    from worker.environments.sandbox import ToolSandbox

_INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    found = _INTEGER.findall(text)
    return int(found[-1]) if found else None


class GuessNumberEnvironment(Environment):
    name = "guess_number"

    def __init__(
        self,
        config: EnvironmentConfig,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_model_len: int,
        sandbox: ToolSandbox | None = None,
    ) -> None:
        super().__init__(config, tokenizer, max_model_len=max_model_len, sandbox=sandbox)
        self.low, self.high = check_guess_kwargs(config.kwargs)

    def rules(self) -> str:
        return (
            f"I picked a whole number between {self.low} and {self.high}. Guess it: answer "
            "with one number; I will say higher or lower."
        )

    def rollout(
        self,
        engine: TurnEngine,
        prompt_messages: Sequence[Mapping[str, Any]],
        *,
        max_new_tokens: int,
        seed: int = 0,
    ) -> Trajectory:
        secret = random.Random(seed).randint(self.low, self.high)
        chat = self.start(with_instructions(prompt_messages, self.rules()))
        guesses: list[int] = []
        stop = self._loop(chat, engine, max_new_tokens, secret, guesses)
        info = {"secret": secret, "found": secret in guesses, "guesses": guesses}
        return chat.finish(stop, info=info)

    def _loop(
        self,
        chat: Conversation,
        engine: TurnEngine,
        max_new: int,
        secret: int,
        guesses: list[int],
    ) -> StopReason:
        for turn_index in range(self.max_turns):
            turn = chat.model_turn(engine, max_new)
            chat.record_model_message(turn.content)
            if turn.finish_reason == "length":
                return cut_reason(turn)
            guess = last_integer(turn.content)
            if guess is not None:
                guesses.append(guess)
            if guess == secret:
                return "done"
            if turn_index == self.max_turns - 1:
                return "max_turns"
            if not chat.append_environment([self._answer(guess, secret)]):
                return "token_budget"
        raise AssertionError("unreachable: the last turn returns")

    def _answer(self, guess: int | None, secret: int) -> TranscriptMessage:
        if guess is None:
            text = f"Answer with one whole number between {self.low} and {self.high}."
        else:
            text = "Higher." if guess < secret else "Lower."
        return TranscriptMessage(role="user", content=text, kind="feedback")
