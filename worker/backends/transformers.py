"""Generation with transformers (+ PEFT adapters): the CPU backend, and a reference for vLLM.

Sampling as docs/architecture/loss.md, "Sampling", says: pad = EOS with left padding and an
attention mask, `top_k = 0` and `top_p = 1.0` set explicitly (transformers' generation config has
defaults), and the log-prob of each sampled token taken from the raw `output_logits` divided by the
temperature — never from `output_scores` — so it describes the distribution actually sampled.

Concurrency (worker/backends/base.py): `generate` may be called from many threads. The calls
are queued (worker/backends/batching.py) to one engine thread, which runs forward batches of up
to `max_batch_sequences` rows of one adapter (run, version) and one (temperature,
max_new_tokens), taken from the calls waiting when it becomes free. A cancelled call's rows stop
at the next token (the stopping criterion answers per row) and the call raises at once; the
other rows of its batch go on. Adapter loads, writes into a slot and evictions run on the engine
thread between batches, so none races a forward pass; a slot whose version a queued or running
call uses is never given up.

Seeds. A batch holding rows of one call only continues that call's own torch RNG stream,
seeded with the call's seed at its first such batch: a call that never shares a batch samples
exactly as if it ran alone (as the single-threaded backend did), whatever ran between its
batches. A batch holding rows of several calls is seeded from their seeds and row ranges: the
same calls batched the same way sample the same tokens, but which calls share a batch depends
on when they arrive, so concurrent calls are not reproducible token for token. Log-probs always
describe the distribution actually sampled.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from lm.adapter_io import read_adapter_weights, same_adapter_shape, write_adapter_weights
from lm.models import load_model, load_tokenizer
from protocol.adapters import AdapterMismatch
from protocol.seeds import derived_seed
from worker.backends.base import (
    Backend,
    Completion,
    EngineFault,
    SamplingSpec,
)
from worker.backends.batching import Batch, Call, CallQueue

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from worker.adapters import AdapterHandle

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _StopRows(StoppingCriteria):
    """Ends each row at the next token once its call's cancel event is set (per-row answers:
    the other rows of the batch go on)."""

    def __init__(self, events: Sequence[threading.Event]) -> None:
        self.events = events

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> Any:
        stop = [event.is_set() for event in self.events]
        return torch.tensor(stop, dtype=torch.bool, device=input_ids.device)


def shared_seed(batch: Batch) -> int:
    """A seed for a batch of several calls: a function of their seeds and row ranges."""
    parts = [
        part for call, start, stop in batch.segments for part in (call.sampling.seed, start, stop)
    ]
    return derived_seed(*parts)


def _same(exc: Exception) -> Exception:
    return exc


def _out_of_memory(exc: torch.OutOfMemoryError) -> EngineFault:
    fault = EngineFault(f"out of memory: {exc}")
    fault.__cause__ = exc
    return fault


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
    """One base model in eval mode, driven by one engine thread; PEFT adapters loaded into
    slots per (run, version)."""

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
        self.num_threads = torch.get_num_threads()  # set again on the engine thread
        self.max_batch_sequences = max_batch_sequences
        self.max_loaded_adapters = max(1, max_loaded_adapters)
        self.eos_ids = eos_ids_of(self._tokenizer, self.model)
        pad = self._tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self.peft: Any = None  # peft.PeftModel once the first adapter is loaded
        # (run, version) -> the adapter slot holding it, least recently used first; a slot is
        # one PEFT adapter, and its folder says what shape of weights it holds. Changed under
        # _slots by the engine thread and by a load writing into a free slot beside a batch.
        self._loaded: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._slot_folders: dict[str, Path] = {}
        self._slots = threading.RLock()
        self._slot_ids = itertools.count()
        self._dropped: set[tuple[str, int]] = set()  # given up first when a slot is needed
        self._dropped_lock = threading.Lock()
        self.adapter_loads = 0  # versions made ready
        self.adapter_writes = 0  # of them, written into an existing slot (no new adapter)
        self.forward_batches = 0  # model.generate calls
        self.batched_rows = 0  # rows in them
        self.shared_batches = 0  # of them, batches holding rows of more than one call
        self._queue = CallQueue(max_batch_sequences)
        self._engine = threading.Thread(
            target=self._engine_loop, name="transformers-engine", daemon=True
        )
        self._engine.start()

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def default_inflight_sequences(self) -> int:
        return self.max_batch_sequences

    @property
    def loaded_adapters(self) -> list[tuple[str, int]]:
        """The (run, version) keys in the slots, least recently used first."""
        return list(self._loaded)

    @property
    def queued_calls(self) -> int:
        """Calls with rows not yet handed to a forward batch."""
        return self._queue.queued_calls

    # -- the engine thread ---------------------------------------------------------------------

    def _engine_loop(self) -> None:
        torch.set_num_threads(self.num_threads)
        with torch.inference_mode():
            while (work := self._queue.next_work()) is not None:
                if isinstance(work, Batch):
                    self._run_batch(work)
                    self._trim_slots()
                else:
                    CallQueue.run_task(work)

    def close(self) -> None:
        """Stop the engine thread; calls still queued raise EngineFault."""
        self._queue.close(EngineFault("the backend is closed"))
        self._engine.join()

    # -- adapters ------------------------------------------------------------------------------

    @staticmethod
    def adapter_name(handle: AdapterHandle) -> str:
        return f"r{handle.run_id.replace('-', '')}_v{handle.version}"

    def load_adapter(self, adapter: AdapterHandle) -> None:
        """Read the weights here, and copy them into a free slot of the same shape beside the
        batch under way; a version that needs a new slot is built on the engine thread between
        two batches."""
        self._mark_dropped(adapter.key, False)
        state = read_adapter_weights(adapter.path)
        if not self._write_beside_generation(adapter, state):
            self._queue.run_on_engine(lambda: self._load_adapter(adapter, state))

    def _write_beside_generation(self, handle: AdapterHandle, state: dict[str, Any]) -> bool:
        """Copy the weights into a free slot of the same shape, now, in this thread; False when
        there is none (or the version is loaded already: True). Safe beside a batch: the slot
        leaves the map before the copy, so no batch can pick it, versions of queued or running
        calls are never taken (`_victim`), and a batch reads only its own adapter's weights."""
        with self._slots:
            if handle.key in self._loaded:
                self._loaded.move_to_end(handle.key)
                return True
            if self.peft is None or len(self._loaded) < self.max_loaded_adapters:
                return False
            victim = self._victim()
            if victim is None:
                return False
            slot = self._loaded[victim]
            if not same_adapter_shape(self._slot_folders[slot], handle.path):
                return False
            del self._loaded[victim]
            try:
                # slots built on the engine thread hold inference tensors: written as such
                with torch.inference_mode():
                    write_adapter_weights(self.peft, handle.path, slot, state)
            except Exception as exc:
                del self._slot_folders[slot]  # its weights are no version's any more
                failed: Exception | None = exc
            else:
                self._slot_folders[slot] = handle.path
                self._loaded[handle.key] = slot
                self.adapter_loads += 1
                self.adapter_writes += 1
                failed = None
        if failed is not None:  # the broken slot goes, on the engine thread (never under _slots)
            self._queue.run_on_engine(lambda: self.peft.delete_adapter(slot))
            raise AdapterMismatch("adapter_model.safetensors", str(failed)) from failed
        log.info("loaded adapter %s from %s", self.adapter_name(handle), handle.path)
        return True

    def drop_adapter(self, key: tuple[str, int]) -> None:
        self._mark_dropped(key, True)

    def _mark_dropped(self, key: tuple[str, int], dropped: bool) -> None:
        with self._dropped_lock:
            if dropped:
                self._dropped.add(key)
            else:
                self._dropped.discard(key)

    def _load_adapter(self, handle: AdapterHandle, state: dict[str, Any] | None = None) -> str:
        """The slot holding this (run, version), made ready if needed (engine thread): a slot no
        call uses (`_victim`) takes the new weights by a copy (same shape), or is rebuilt for
        them; when every slot is in use, a new one is built beyond `max_loaded_adapters`
        (`_trim_slots` gives it back once free)."""
        with self._slots:
            return self._load_locked(handle, state)

    def _load_locked(self, handle: AdapterHandle, state: dict[str, Any] | None) -> str:
        slot = self._loaded.get(handle.key)
        if slot is not None:
            self._loaded.move_to_end(handle.key)
            return slot
        victim = self._victim() if len(self._loaded) >= self.max_loaded_adapters else None
        if victim is None:
            slot = self._build_slot(handle.path)
        else:
            slot = self._loaded.pop(victim)
            if same_adapter_shape(self._slot_folders[slot], handle.path):
                write_adapter_weights(self.peft, handle.path, slot, state)
                self.adapter_writes += 1
            else:
                self.peft.delete_adapter(slot)
                slot = self._build_slot(handle.path)
        self._slot_folders[slot] = handle.path
        self._loaded[handle.key] = slot
        self.adapter_loads += 1
        log.info("loaded adapter %s from %s", self.adapter_name(handle), handle.path)
        return slot

    def _victim(self) -> tuple[str, int] | None:
        """The loaded version to give up: never one a queued or running call uses; a dropped
        one before the others, least recently used first."""
        free = [key for key in self._loaded if not self._queue.pinned(key)]
        with self._dropped_lock:
            dropped = [key for key in free if key in self._dropped]
        candidates = dropped or free
        return candidates[0] if candidates else None

    def _trim_slots(self) -> None:
        """Back within `max_loaded_adapters` once the versions of extra slots are free."""
        with self._slots:
            self._trim_locked()

    def _trim_locked(self) -> None:
        while len(self._loaded) > self.max_loaded_adapters:
            victim = self._victim()
            if victim is None:
                return
            slot = self._loaded.pop(victim)
            del self._slot_folders[slot]
            self.peft.delete_adapter(slot)

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
        greedy = sampling.temperature == 0  # eval only
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
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

    @property
    def max_model_len(self) -> int:
        """The model's position limit (max_position_embeddings), else the tokenizer's."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        return int(limit) if isinstance(limit, int) and limit > 0 else super().max_model_len

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        group_size: int,
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        call = Call(prompts, group_size, sampling, adapter, cancel or threading.Event())
        if not call.rows:
            return []
        if adapter is not None:
            self._mark_dropped(adapter.key, False)
        self._queue.submit(call)
        return self._queue.wait(call)

    def restart(self) -> None:
        """After an out-of-memory: give the allocator's cached blocks back (the weights stay)."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _run_batch(self, batch: Batch) -> None:
        """One forward batch (engine thread); its calls get their rows, or each an error."""
        rows = batch.rows
        self.forward_batches += 1
        self.batched_rows += len(rows)
        self.shared_batches += len(batch.segments) > 1
        try:
            with self._selected(batch.head.adapter) as module:
                self._seed(batch)
                completions = self._generate_chunk(
                    module,
                    [call.rows[i] for call, i in rows],
                    [call.prompts[call.rows[i][0]] for call, i in rows],
                    batch.head.sampling,
                    [call.cancel for call, _i in rows],
                )
                if len(batch.segments) == 1:
                    batch.head.rng_state = self._rng_state()
        except torch.OutOfMemoryError as exc:
            self._queue.fail(batch, functools.partial(_out_of_memory, exc))
        except Exception as exc:
            self._queue.fail(batch, functools.partial(_same, exc))
        else:
            self._queue.deliver(batch, completions)

    def _seed(self, batch: Batch) -> None:
        """A lone call's batch continues its own RNG stream; a shared batch is seeded from its
        calls' seeds and row ranges (module docstring, "Seeds")."""
        if len(batch.segments) > 1:
            torch.manual_seed(shared_seed(batch))
        elif batch.head.rng_state is None:
            torch.manual_seed(batch.head.sampling.seed)
        else:
            self._set_rng_state(batch.head.rng_state)

    def _on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def _rng_state(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(self.device) if self._on_cuda() else None
        return torch.get_rng_state(), cuda

    def _set_rng_state(self, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, self.device)

    def _generate_chunk(
        self,
        module: Any,
        chunk: list[tuple[int, int]],
        rows: list[Sequence[int]],
        sampling: SamplingSpec,
        cancels: Sequence[threading.Event],
    ) -> list[Completion]:
        """Completions of `rows` ((prompt, group) indices in `chunk`), row i stopping at the
        next token once `cancels[i]` is set."""
        input_ids, mask = left_pad(rows, self.pad_id)
        out = module.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=self._config(sampling),
            stopping_criteria=StoppingCriteriaList([_StopRows(cancels)]),
        )
        new_tokens = out.sequences[:, input_ids.shape[1] :]  # (B, S), on the device
        # One (B, V) logits tensor per step: take each sampled token's log-prob step by step
        # instead of stacking (B, S, V) (every step's logits held at once), on the device: only
        # the (B, S) result crosses to the host (a (B, V) copy and a one-thread log_softmax per step
        # would cost more than the decode step on a GPU).
        logprobs = torch.empty(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)
        for step, logits in enumerate(out.logits):
            # greedy (T = 0, eval only): log-probs at T = 1, which nothing trains on
            scaled = torch.log_softmax(logits.float() / (sampling.temperature or 1.0), dim=-1)
            logprobs[:, step] = scaled.gather(1, new_tokens[:, step : step + 1]).squeeze(1)
        new_tokens, logprobs = new_tokens.cpu(), logprobs.cpu()
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
