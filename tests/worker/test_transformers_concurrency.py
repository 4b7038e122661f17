"""The transformers backend under concurrent calls (worker/backends/base.py's contract), on the
real small model: rows of calls with different adapters are each generated with their own
adapter (log-probs equal a forward pass of that adapter, and visibly differ from the other's),
same-key calls share forward batches, a cancelled call stops alone, adapters in use survive
loads of other versions, and an engine fault fails every call of its batch.

To make calls share a batch deterministically, `batched_together` keeps the engine waiting
until they are all queued; the engine then takes them together.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lm.adapter_io import load_adapter_version
from lm.chat import encode_prompt
from tests.worker.conftest import SMALL_MODEL, make_adapter_version
from tests.worker.test_transformers_backend import MAX_TOL, MEAN_TOL, T, check_shape, deltas
from worker.adapters import AdapterHandle
from worker.backends.base import EngineFault, GenerationCancelled, SamplingSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUN = str(uuid.UUID(int=8))
LONG = "Write a long story about a dragon who learns to cook."


def handle(version: int, path: Path) -> AdapterHandle:
    return AdapterHandle(RUN, version, f"{version:064x}", path)


@pytest.fixture(scope="module")
def references(small_model: Any, adapter_dirs: dict[int, Path]) -> dict[int, Any]:
    """The small model with adapter v1 and with v2, for teacher-forced scoring."""
    return {v: load_adapter_version(copy.deepcopy(small_model), adapter_dirs[v]) for v in (1, 2)}


@pytest.fixture(scope="module")
def long_prompt(small_tokenizer: Any) -> list[int]:
    return encode_prompt(small_tokenizer, LONG, "You are a helpful assistant.")


@pytest.fixture
def make_backend() -> Iterator[Callable[..., Any]]:
    from worker.backends.transformers import TransformersBackend

    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        made.append(TransformersBackend(SMALL_MODEL, num_threads=1, **kwargs))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def start_threads(*fns: Callable[[], Any]) -> Callable[[], list[Any]]:
    """Start each fn in its own thread; a function joining them, answering their results (or
    exceptions) in order."""
    out: list[Any] = [None] * len(fns)

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            out[i] = fn()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()

    def join() -> list[Any]:
        for t in threads:
            t.join(240)
        return out

    return join


def in_threads(*fns: Callable[[], Any]) -> list[Any]:
    return start_threads(*fns)()


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def batched_together(backend: Any, *calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads while the engine waits (a task on its thread) until all are
    queued, so that it then takes them together; their results (or exceptions)."""
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(120)

    holder = threading.Thread(target=backend._queue.run_on_engine, args=(hold,))
    holder.start()
    started.wait(60)
    try:
        join = start_threads(*calls)
        wait_until(lambda: backend.queued_calls == len(calls))
    finally:
        gate.set()
        holder.join(60)
    return join()


def test_concurrent_calls_of_two_adapters_each_use_their_own(
    make_backend: Callable[..., Any],
    references: dict[int, Any],
    prompt_ids: list[list[int]],
    adapter_dirs: dict[int, Path],
) -> None:
    backend = make_backend(max_loaded_adapters=2)
    versions = (1, 2, 1)
    batches = backend.forward_batches
    outs = batched_together(
        backend,
        *(
            lambda v=v, seed=seed: backend.generate(
                prompt_ids, 2, SamplingSpec(T, 12, seed), handle(v, adapter_dirs[v])
            )
            for seed, v in enumerate(versions)
        ),
    )
    # The two v1 calls in one batch, the v2 call in another.
    assert backend.forward_batches - batches == 2
    assert backend.shared_batches == 1
    for v, out in zip(versions, outs, strict=True):
        check_shape(out, len(prompt_ids), 2, set(backend.eos_ids), 12)
        d = deltas(references[v], prompt_ids, out, backend.pad_id)
        assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL, (v, d.max())
        wrong = deltas(references[3 - v], prompt_ids, out, backend.pad_id)
        assert wrong.mean().item() > 100 * MEAN_TOL, (v, wrong.mean())


def test_a_cancelled_call_stops_alone(
    make_backend: Callable[..., Any],
    references: dict[int, Any],
    adapter_dirs: dict[int, Path],
    long_prompt: list[int],
) -> None:
    backend = make_backend()
    v1 = handle(1, adapter_dirs[1])
    cancels = [threading.Event() for _ in range(3)]
    raised_at: list[float] = []

    def one(i: int) -> Any:
        try:
            return backend.generate([long_prompt], 2, SamplingSpec(T, 96, i), v1, cancels[i])
        except GenerationCancelled:
            raised_at.append(time.monotonic())
            raise

    def cancel_mid_generation() -> None:
        wait_until(lambda: backend.forward_batches == batches + 1)  # the shared batch runs
        time.sleep(0.2)
        cancelled_at.append(time.monotonic())
        cancels[1].set()

    batches = backend.forward_batches
    cancelled_at: list[float] = []
    canceller = threading.Thread(target=cancel_mid_generation)
    canceller.start()
    outs = batched_together(backend, *(lambda i=i: one(i) for i in range(3)))
    canceller.join(60)
    assert isinstance(outs[1], GenerationCancelled)
    assert raised_at[0] - cancelled_at[0] < 0.5
    assert backend.forward_batches - batches == 1 and backend.shared_batches == 1
    for out in (outs[0], outs[2]):
        check_shape(out, 1, 2, set(backend.eos_ids), 96)
        d = deltas(references[1], [long_prompt], out, backend.pad_id)
        assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL


def test_a_free_slot_is_written_beside_the_batch_under_way(
    make_backend: Callable[..., Any],
    references: dict[int, Any],
    small_model: Any,
    adapter_dirs: dict[int, Path],
    long_prompt: list[int],
    tmp_path: Path,
) -> None:
    # Two slots holding v1 and v2; while a v1 batch generates, v3 (same shape) is copied into
    # v2's slot at once, without waiting for the batch to end, and the batch is undisturbed.
    backend = make_backend(max_loaded_adapters=2)
    v1, v2 = handle(1, adapter_dirs[1]), handle(2, adapter_dirs[2])
    v3 = handle(3, make_adapter_version(small_model, tmp_path / "v3", seed=3))
    backend.load_adapter(v1)
    backend.load_adapter(v2)
    loaded_during: list[bool] = []
    finished = threading.Event()

    def generate() -> Any:
        try:
            return backend.generate([long_prompt], 2, SamplingSpec(T, 96, 5), v1)
        finally:
            finished.set()

    def load_during_the_batch() -> None:
        wait_until(lambda: backend.forward_batches == 1)
        time.sleep(0.2)
        backend.load_adapter(v3)
        loaded_during.append(not finished.is_set())

    out, loaded = in_threads(generate, load_during_the_batch)
    assert loaded is None, loaded
    assert loaded_during == [True] and backend.forward_batches == 1
    assert backend.adapter_writes == 1
    assert set(backend.loaded_adapters) == {v1.key, v3.key}
    check_shape(out, 1, 2, set(backend.eos_ids), 96)
    d = deltas(references[1], [long_prompt], out, backend.pad_id)
    assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL


def test_loads_during_a_generate_never_evict_its_adapter(
    make_backend: Callable[..., Any],
    small_model: Any,
    references: dict[int, Any],
    adapter_dirs: dict[int, Path],
    long_prompt: list[int],
    tmp_path: Path,
) -> None:
    # Two slots, batches of 2 rows: the v1 call's 6 rows take three batches, and v2 then v3 are
    # loaded between them. v3 takes v2's slot (by a copy), never v1's.
    backend = make_backend(max_loaded_adapters=2, max_batch_sequences=2)
    v1, v2 = handle(1, adapter_dirs[1]), handle(2, adapter_dirs[2])
    v3 = handle(3, make_adapter_version(small_model, tmp_path / "v3", seed=3))
    seen: list[list[tuple[str, int]]] = []

    def load_during_generate() -> None:
        wait_until(lambda: backend.forward_batches == 1)
        for h in (v2, v3):
            backend.load_adapter(h)
            seen.append(backend.loaded_adapters)

    out, loaded = in_threads(
        lambda: backend.generate([long_prompt] * 3, 2, SamplingSpec(T, 24, 4), v1),
        load_during_generate,
    )
    assert loaded is None, loaded
    assert backend.forward_batches == 3
    assert [set(keys) for keys in seen] == [{v1.key, v2.key}, {v1.key, v3.key}]
    assert (backend.adapter_loads, backend.adapter_writes) == (3, 1)
    d = deltas(references[1], [long_prompt] * 3, out, backend.pad_id)
    assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL
    # A dropped version is given up first, even when it is not the least recently used.
    backend.load_adapter(v3)
    backend.drop_adapter(v3.key)
    backend.load_adapter(v2)
    assert backend.loaded_adapters == [v1.key, v2.key]


def test_with_one_slot_a_version_in_use_gets_an_extra_slot_until_free(
    make_backend: Callable[..., Any],
    references: dict[int, Any],
    adapter_dirs: dict[int, Path],
    long_prompt: list[int],
) -> None:
    backend = make_backend(max_loaded_adapters=1, max_batch_sequences=2)
    v1, v2 = handle(1, adapter_dirs[1]), handle(2, adapter_dirs[2])
    seen: list[list[tuple[str, int]]] = []

    def load_during_generate() -> None:
        wait_until(lambda: backend.forward_batches == 1)
        backend.load_adapter(v2)
        seen.append(backend.loaded_adapters)

    out, _ = in_threads(
        lambda: backend.generate([long_prompt] * 2, 2, SamplingSpec(T, 24, 4), v1),
        load_during_generate,
    )
    assert [set(keys) for keys in seen] == [{v1.key, v2.key}]  # over the bound: v1 in use
    assert len(backend.loaded_adapters) == 1  # back within it once v1's call is done
    d = deltas(references[1], [long_prompt] * 2, out, backend.pad_id)
    assert d.mean().item() < MEAN_TOL and d.max().item() < MAX_TOL


def test_a_lone_call_samples_the_same_whatever_runs_between_its_batches(
    make_backend: Callable[..., Any], prompt_ids: list[list[int]], adapter_dirs: dict[int, Path]
) -> None:
    backend = make_backend(max_batch_sequences=2)
    sampling = SamplingSpec(T, 10, seed=21)
    alone = backend.generate(prompt_ids, 2, sampling, None)
    v1 = handle(1, adapter_dirs[1])
    together, _ = in_threads(
        lambda: backend.generate(prompt_ids, 2, sampling, None),
        lambda: backend.generate(prompt_ids, 2, SamplingSpec(T, 10, seed=9), v1),
    )
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert backend.shared_batches == 0


def test_out_of_memory_fails_every_call_of_its_batch_only(
    make_backend: Callable[..., Any],
    prompt_ids: list[list[int]],
    adapter_dirs: dict[int, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend()
    poison = prompt_ids[0]
    generate_chunk = backend._generate_chunk

    def chunk(module: Any, jobs: Any, rows: Any, sampling: Any, cancels: Any) -> Any:
        if any(list(row) == poison for row in rows):
            raise torch.OutOfMemoryError("injected")
        return generate_chunk(module, jobs, rows, sampling, cancels)

    monkeypatch.setattr(backend, "_generate_chunk", chunk)
    v1 = handle(1, adapter_dirs[1])
    outs = batched_together(
        backend,
        lambda: backend.generate([poison], 2, SamplingSpec(T, 4, 1), None),
        lambda: backend.generate(prompt_ids[1:], 2, SamplingSpec(T, 4, 2), None),
        lambda: backend.generate(prompt_ids[1:], 2, SamplingSpec(T, 4, 3), v1),
    )
    assert [type(o) for o in outs[:2]] == [EngineFault, EngineFault]
    assert outs[0] is not outs[1] and "out of memory" in str(outs[0])
    assert isinstance(outs[2], list) and len(outs[2]) == 2
