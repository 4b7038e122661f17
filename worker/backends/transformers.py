"""Generation with transformers (+ PEFT adapters): the CPU backend, and a reference for vLLM.

Sampling follows facts.md's pitfalls: pad = EOS with left padding and an attention mask,
`top_k = 0` and `top_p = 1.0` set explicitly (transformers' generation config has defaults),
and the log-prob of each sampled token taken from the raw `output_logits` divided by the
temperature — never from `output_scores` — so it describes the distribution actually sampled.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from lm.adapter_io import same_adapter_shape, write_adapter_weights
from lm.models import load_model, load_tokenizer
from worker.backends.base import (
    Backend,
    Completion,
    EngineFault,
    GenerationCancelled,
    SamplingSpec,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from worker.adapters import AdapterHandle

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _StopOnEvent(StoppingCriteria):
    """Ends generation at the next token once the cancel event is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> Any:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


def eos_ids_of(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """Every token id that ends a completion (tokenizer EOS + generation-config EOS)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    if not ids:
        raise ValueError("the model has no EOS token")
    return sorted(ids)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T), padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


class TransformersBackend(Backend):
    """One base model in eval mode; PEFT adapters loaded and switched per (run, version)."""

    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        num_threads: int | None = None,
        max_batch_sequences: int = 64,
        max_loaded_adapters: int = 4,
    ) -> None:
        self._tokenizer = load_tokenizer(model)
        self.model = load_model(model, dtype=DTYPES[dtype], device=device, num_threads=num_threads)
        self.device = device
        self.max_batch_sequences = max_batch_sequences
        self.max_loaded_adapters = max_loaded_adapters
        self.eos_ids = eos_ids_of(self._tokenizer, self.model)
        pad = self._tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self.peft: Any = None  # peft.PeftModel once the first adapter is loaded
        # (run, version) -> the adapter slot holding it, least recently used first; a slot is
        # one PEFT adapter, and its folder says what shape of weights it holds.
        self._loaded: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._slot_folders: dict[str, Path] = {}
        self._slot_ids = itertools.count()
        self.adapter_loads = 0  # versions made ready
        self.adapter_writes = 0  # of them, written into an existing slot (no new adapter)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def default_inflight_sequences(self) -> int:
        return self.max_batch_sequences

    # -- adapters ------------------------------------------------------------------------------

    @staticmethod
    def adapter_name(handle: AdapterHandle) -> str:
        return f"r{handle.run_id.replace('-', '')}_v{handle.version}"

    def _load_adapter(self, handle: AdapterHandle) -> str:
        """The slot holding this (run, version), made ready if needed: when the slots are full,
        the least recently used one takes the new weights by a copy (same shape), or is
        rebuilt for them."""
        slot = self._loaded.get(handle.key)
        if slot is not None:
            self._loaded.move_to_end(handle.key)
            return slot
        if len(self._loaded) >= self.max_loaded_adapters:
            _old_key, slot = self._loaded.popitem(last=False)
            if same_adapter_shape(self._slot_folders[slot], handle.path):
                write_adapter_weights(self.peft, handle.path, slot)
                self.adapter_writes += 1
            else:
                self.peft.delete_adapter(slot)
                slot = self._build_slot(handle.path)
        else:
            slot = self._build_slot(handle.path)
        self._slot_folders[slot] = handle.path
        self._loaded[handle.key] = slot
        self.adapter_loads += 1
        log.info("loaded adapter %s from %s", self.adapter_name(handle), handle.path)
        return slot

    def _build_slot(self, folder: Path) -> str:
        """A new PEFT adapter built from a version folder."""
        from peft import PeftModel

        slot = f"slot{next(self._slot_ids)}"
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(
                self.model, str(folder), adapter_name=slot, is_trainable=False
            )
            self.peft.eval()
        else:
            self.peft.load_adapter(str(folder), adapter_name=slot, is_trainable=False)
        return slot

    @contextlib.contextmanager
    def _selected(self, adapter: AdapterHandle | None) -> Iterator[Any]:
        """The module to generate with: the base model, or the PEFT model on this adapter."""
        if adapter is None:
            if self.peft is None:
                yield self.model
            else:
                with self.peft.disable_adapter():
                    yield self.peft
            return
        name = self._load_adapter(adapter)
        self.peft.set_adapter(name)
        yield self.peft

    # -- generation ----------------------------------------------------------------------------

    def _config(self, sampling: SamplingSpec) -> GenerationConfig:
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_k=0,
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            output_logits=True,
            return_dict_in_generate=True,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        cancel = cancel or threading.Event()
        jobs = [(p, g) for p in range(len(prompts)) for g in range(group_size)]
        torch.manual_seed(sampling.seed)
        completions: list[Completion] = []
        with torch.inference_mode(), self._selected(adapter) as module:
            for start in range(0, len(jobs), self.max_batch_sequences):
                chunk = jobs[start : start + self.max_batch_sequences]
                rows = [prompts[p] for p, _g in chunk]
                try:
                    completions.extend(self._generate_chunk(module, chunk, rows, sampling, cancel))
                except torch.OutOfMemoryError as exc:
                    raise EngineFault(f"out of memory: {exc}") from exc
                if cancel.is_set():
                    raise GenerationCancelled()
        return completions

    def restart(self) -> None:
        """After an out-of-memory: give the allocator's cached blocks back (the weights stay)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _generate_chunk(
        self,
        module: Any,
        chunk: list[tuple[int, int]],
        rows: list[Sequence[int]],
        sampling: SamplingSpec,
        cancel: threading.Event,
    ) -> list[Completion]:
        input_ids, mask = left_pad(rows, self.pad_id)
        out = module.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=self._config(sampling),
            stopping_criteria=StoppingCriteriaList([_StopOnEvent(cancel)]),
        )
        if cancel.is_set():
            raise GenerationCancelled()
        new_tokens = out.sequences[:, input_ids.shape[1] :].cpu()  # (B, S)
        # One (B, V) logits tensor per step: take each sampled token's log-prob step by step
        # instead of stacking (B, S, V) (facts.md pitfall 5).
        logprobs = torch.empty(new_tokens.shape, dtype=torch.float32)  # (B, S)
        for step, logits in enumerate(out.logits):
            scaled = torch.log_softmax(logits.float().cpu() / sampling.temperature, dim=-1)
            logprobs[:, step] = scaled.gather(1, new_tokens[:, step : step + 1]).squeeze(1)
        return [
            self._completion(p, g, new_tokens[i].tolist(), logprobs[i].tolist())
            for i, (p, g) in enumerate(chunk)
        ]

    def _completion(
        self, prompt_index: int, group_index: int, tokens: list[int], logprobs: list[float]
    ) -> Completion:
        """Cut at the first EOS (kept: it is a sampled token); later positions are padding."""
        eos = set(self.eos_ids)
        for i, tok in enumerate(tokens):
            if tok in eos:
                return Completion(
                    prompt_index, group_index, tokens[: i + 1], logprobs[: i + 1], "stop"
                )
        return Completion(prompt_index, group_index, tokens, logprobs, "length")
