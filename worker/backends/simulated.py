"""A simulated generation engine: GPU-speed timing without a model. Benchmarks only.

This backend exists so that benchmarks can ask whether the worker loop and the control plane
keep a GPU-speed engine full. It is never a default, and no test of learning uses it: its
completions are tokens sampled from one fixed distribution, not from a model.

Engine. One step thread decodes up to `max_batch` sequences per step, each step taking
`step_s` whatever its occupancy (decoding a small model is memory-bound: the step reads the
weights once for the whole batch). Continuous batching: a sequence submitted by any `generate`
call joins at the next step (its prompt's prefill, `prefill_s_per_token` per token, added to
that step) and leaves after its last token; sequences beyond `max_batch` wait in a FIFO queue.
Several `generate` calls (threads) therefore share steps, as they share a vLLM engine.

Profile (the defaults, `SimulatedSettings` in worker/config.py). An assumption, not a
measurement made here (no GPU was lent to the task that wrote this): a ~1.5B model (e.g.
Qwen2.5-1.5B, bf16) under vLLM on one H100 decodes about 256 concurrent sequences at about
25 ms per step, i.e. ~10,000 output tokens/s, the order of magnitude vLLM's throughput
benchmarks report for models of that size on one H100; prefill at ~50,000 prompt tokens/s
(2e-5 s per token); an adapter loads at ~2 GB/s (a local NVMe read and a host-to-device copy).
Replace them with a measured profile through the settings when one is available.

Tokens. Real token ids of the run's tokenizer: `vocab_tokens` ordinary ids plus EOS, with fixed
logits (a seeded normal draw; EOS's logit set so that at T = 1 a completion's mean length is
`mean_completion_tokens`). Each token is sampled from softmax(logits / T), and its log-prob is
log_softmax(logits / T) of that token: honest for the distribution sampled. A completion ends
with EOS (kept, finish_reason "stop") or at max_new_tokens ("length"). Every completion is a
function of (sampling.seed, prompt index, group index) alone.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from worker.backends.base import Backend, Completion, GenerationCancelled, SamplingSpec
from worker.config import SimulatedSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from worker.adapters import AdapterHandle

CANCEL_POLL_S = 0.002


def lease_seconds(
    profile: SimulatedSettings, n_sequences: int, prompt_tokens: int, new_tokens: int
) -> float:
    """Engine time for `n_sequences` of `new_tokens` each (prompts of `prompt_tokens`), alone
    on the engine: one decode step per token per batch-full, plus every prompt's prefill."""
    rounds = math.ceil(n_sequences / profile.max_batch)
    return rounds * new_tokens * profile.step_s + n_sequences * prompt_tokens * (
        profile.prefill_s_per_token
    )


@dataclass
class _Call:
    """One `generate` call's sequences still running, and whether its caller gave up."""

    remaining: int
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False


@dataclass
class _Sequence:
    call: _Call
    prompt_tokens: int
    length: int  # tokens to decode
    decoded: int = 0


class FixedDistribution:
    """Fixed logits over `vocab_tokens` ordinary token ids and EOS (the last entry)."""

    def __init__(self, token_ids: Sequence[int], eos_id: int, mean_length: float) -> None:
        self.token_ids = np.array([*token_ids, eos_id], dtype=np.int64)
        logits = np.random.default_rng(0).normal(size=len(token_ids))
        p_eos = 1.0 / mean_length
        eos_logit = math.log(p_eos / (1 - p_eos)) + float(np.log(np.exp(logits).sum()))
        self.logits = np.append(logits, eos_logit)
        self.eos_index = len(token_ids)

    def log_probs(self, temperature: float) -> np.ndarray:
        """log_softmax(logits / T)."""
        scaled = self.logits / temperature
        return scaled - (scaled.max() + np.log(np.exp(scaled - scaled.max()).sum()))

    def sample(
        self, seed: int, prompt_index: int, group_index: int, sampling: SamplingSpec
    ) -> tuple[list[int], list[float], bool]:
        """(token ids, their log-probs, ended with EOS) of one completion."""
        log_probs = self.log_probs(sampling.temperature or 1.0)
        rng = np.random.default_rng([seed, prompt_index, group_index])
        if sampling.temperature == 0:  # greedy (eval only)
            drawn = np.full(sampling.max_new_tokens, int(np.argmax(log_probs)))
        else:
            drawn = rng.choice(len(self.logits), size=sampling.max_new_tokens, p=np.exp(log_probs))
        eos_at = np.flatnonzero(drawn == self.eos_index)
        stop = eos_at.size > 0
        if stop:
            drawn = drawn[: eos_at[0] + 1]
        return self.token_ids[drawn].tolist(), log_probs[drawn].tolist(), stop


def ordinary_token_ids(tokenizer: PreTrainedTokenizerBase, count: int) -> list[int]:
    """`count` token ids that are not special, spread over the vocabulary (fixed choice)."""
    special = set(tokenizer.all_special_ids)
    candidates = [i for i in range(len(tokenizer)) if i not in special]
    chosen = np.random.default_rng(0).choice(len(candidates), size=count, replace=False)
    return sorted(candidates[i] for i in chosen)


class SimulatedBackend(Backend):
    """A timed stand-in for a GPU engine (see the module docstring); benchmarks only."""

    name = "simulated"

    def __init__(self, model: str, profile: SimulatedSettings | None = None) -> None:
        from lm.models import load_tokenizer

        self.profile = profile or SimulatedSettings()
        self._tokenizer = load_tokenizer(model)
        eos = self._tokenizer.eos_token_id
        if eos is None:
            raise ValueError(f"the tokenizer of {model} has no EOS token")
        ids = ordinary_token_ids(self._tokenizer, self.profile.vocab_tokens)
        self.distribution = FixedDistribution(ids, int(eos), self.profile.mean_completion_tokens)
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._closed = False
        self._adapters: set[tuple[str, int]] = set()
        self._adapter_lock = threading.Lock()
        self.busy_seconds = 0.0  # time spent in steps (every step has >= 1 sequence)
        self.tokens_generated = 0
        self.steps = 0
        self.adapter_loads = 0
        self._occupancy_sum = 0.0
        self._thread = threading.Thread(target=self._run, name="simulated-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def default_inflight_sequences(self) -> int:
        return self.profile.max_batch

    @property
    def mean_occupancy(self) -> float:
        """Mean over steps of (sequences in the step) / max_batch."""
        with self._cond:
            return self._occupancy_sum / self.steps if self.steps else 0.0

    # -- adapters ------------------------------------------------------------------------------

    def load_adapter(self, adapter: AdapterHandle) -> None:
        """Read the adapter's files, taking at least bytes / adapter_load_gbps seconds."""
        with self._adapter_lock:
            if adapter.key in self._adapters:
                return
        started = time.monotonic()
        size = sum(len(p.read_bytes()) for p in adapter.path.iterdir() if p.is_file())
        time.sleep(max(0.0, size / (self.profile.adapter_load_gbps * 1e9) - _since(started)))
        with self._adapter_lock:
            if adapter.key not in self._adapters:
                self._adapters.add(adapter.key)
                self.adapter_loads += 1

    def drop_adapter(self, key: tuple[str, int]) -> None:
        with self._adapter_lock:
            self._adapters.discard(key)

    # -- generation ----------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        cancel = cancel or threading.Event()
        if adapter is not None:
            self.load_adapter(adapter)
        completions = self._sample(prompts, group_size, sampling)
        if not completions:
            return []
        call = _Call(remaining=len(completions))
        with self._cond:
            self._waiting.extend(
                _Sequence(call, len(prompts[c.prompt_index]), len(c.token_ids)) for c in completions
            )
            self._cond.notify()
        while not call.done.wait(CANCEL_POLL_S):
            if cancel.is_set():
                self._cancel(call)
                raise GenerationCancelled()
        return completions

    def _sample(
        self, prompts: Sequence[Sequence[int]], group_size: int, sampling: SamplingSpec
    ) -> list[Completion]:
        out = []
        for p in range(len(prompts)):
            for g in range(group_size):
                tokens, logprobs, stop = self.distribution.sample(sampling.seed, p, g, sampling)
                out.append(Completion(p, g, tokens, logprobs, "stop" if stop else "length"))
        return out

    def _cancel(self, call: _Call) -> None:
        with self._cond:
            call.cancelled = True
            self._waiting = deque(s for s in self._waiting if s.call is not call)
            self._active = [s for s in self._active if s.call is not call]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._waiting or self._active):
                    self._cond.wait()
                if self._closed:
                    return
                free = self.profile.max_batch - len(self._active)
                joining = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                self._active.extend(joining)
                batch = len(self._active)
            prefill = sum(s.prompt_tokens for s in joining) * self.profile.prefill_s_per_token
            started = time.monotonic()
            time.sleep(self.profile.step_s + prefill)
            self._end_step(batch, _since(started))

    def _end_step(self, batch: int, seconds: float) -> None:
        """Every sequence still active (not cancelled during the step) decodes one token."""
        with self._cond:
            self.busy_seconds += seconds
            self.steps += 1
            self._occupancy_sum += batch / self.profile.max_batch
            still = []
            for seq in self._active:
                seq.decoded += 1
                self.tokens_generated += 1
                if seq.decoded < seq.length:
                    still.append(seq)
                    continue
                seq.call.remaining -= 1
                if seq.call.remaining == 0:
                    seq.call.done.set()
            self._active = still

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


def _since(started: float) -> float:
    return time.monotonic() - started
