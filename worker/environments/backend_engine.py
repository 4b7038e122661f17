"""A `TurnEngine` over a worker `Backend` (transformers, vLLM, simulated), token-in, token-out.

Each turn is one `Backend.generate` call of one prompt (the trajectory's tokens so far, given as
token ids: the backend applies no template) and group size 1, with the same adapter version for
the whole trajectory and a per-turn seed derived from the trajectory's seed. Nothing in the
backend changes for its other callers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from protocol.seeds import derived_seed
from worker.backends.base import GenerationCancelled, SamplingSpec
from worker.environments.base import Generated

if TYPE_CHECKING:
    from worker.adapters import AdapterHandle
    from worker.backends.base import Backend


def turn_seed(seed: int, turn: int) -> int:
    return derived_seed(seed, turn)


class BackendTurnEngine:
    """One trajectory's engine: fixed adapter (one version from start to end) and temperature."""

    def __init__(
        self,
        backend: Backend,
        *,
        temperature: float,
        seed: int,
        adapter: AdapterHandle | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.backend = backend
        self.temperature = temperature
        self.seed = seed
        self.adapter = adapter
        self.cancel = cancel
        self.turns = 0

    def generate(self, token_ids: Sequence[int], max_new_tokens: int) -> Generated:
        if self.cancel is not None and self.cancel.is_set():
            raise GenerationCancelled()  # an abort between turns stops the rollout here
        sampling = SamplingSpec(self.temperature, max_new_tokens, turn_seed(self.seed, self.turns))
        self.turns += 1
        [done] = self.backend.generate([list(token_ids)], 1, sampling, self.adapter, self.cancel)
        return Generated(list(done.token_ids), list(done.logprobs), done.finish_reason)
