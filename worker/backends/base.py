"""What a generation backend does, independent of the engine (transformers or vLLM).

A backend serves one base model. `generate` samples `group_size` completions for every prompt
(prompts given as token ids from lm/chat.py) with temperature-only sampling and returns, for
each sampled token, its log-prob under the distribution actually sampled:
log_softmax(raw logits / T). `cancel` (a threading.Event) stops the work as soon as possible;
a cancelled call raises `GenerationCancelled`.

A backend is shared by every lease a worker holds (docs/architecture/worker.md, "The worker"):
`generate` may be called from several threads at once, each call's `cancel` stopping that
call's sequences only, and never generating one call's rows with another call's adapter.
`load_adapter` makes a version ready ahead of use (the worker calls it from a background thread
when a version is pushed), and `drop_adapter` says no held lease needs a version any more.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from worker.adapters import AdapterHandle


class GenerationCancelled(Exception):
    """The caller set the cancel event (abort, lost lease, shutdown)."""


class EngineFault(Exception):
    """The engine cannot go on (vLLM's EngineDeadError, out of memory, a device error): the
    requests in flight are lost, and `restart` must bring a fresh engine before the next."""


@dataclass(frozen=True)
class SamplingSpec:
    """Temperature-only sampling (top_p = 1 and no top-k are set explicitly by backends);
    temperature 0 is greedy decoding (eval leases only: their log-probs are not used)."""

    temperature: float
    max_new_tokens: int
    seed: int

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")


@dataclass(frozen=True)
class Completion:
    """One sampled completion: tokens up to and including the first EOS, and their log-probs."""

    prompt_index: int
    group_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class Backend(abc.ABC):
    """A loaded base model that samples completions, with or without a LoRA adapter."""

    name: str = "base"

    @property
    @abc.abstractmethod
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (chat template included)."""

    @abc.abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        """`group_size` completions per prompt, ordered by (prompt_index, group_index)."""

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt + generated) the engine takes: a trajectory's whole
        length (environment.max_total_tokens) may not exceed it. Default: the tokenizer's
        model_max_length, capped (tokenizers without one report a huge sentinel)."""
        length = getattr(self.tokenizer, "model_max_length", None)
        return int(length) if isinstance(length, int) and 0 < length <= 1 << 20 else 2048

    @property
    def default_inflight_sequences(self) -> int:
        """How many sequences the worker keeps in flight on this engine by default
        (`max_inflight_sequences` unset)."""
        return 64

    def load_adapter(self, adapter: AdapterHandle) -> None:  # noqa: B027 - optional hook
        """Make this version ready in the engine now, so that its first `generate` does not
        wait for the load (default: it is loaded on first use)."""

    def drop_adapter(self, key: tuple[str, int]) -> None:  # noqa: B027 - optional hook
        """No held lease needs this (run, version) any more: it may leave the engine."""

    def restart(self) -> None:  # noqa: B027 - optional hook
        """Replace an engine that raised EngineFault with a fresh one (default: the engine
        has no state a fault can break)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the engine (processes, memory)."""
