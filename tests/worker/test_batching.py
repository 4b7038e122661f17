"""The hand-over between generate calls and the engine thread (no model): batches per key in
arrival order, withdrawal on cancel, pins, failures and close."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from worker.adapters import AdapterHandle
from worker.backends.base import Completion, EngineFault, GenerationCancelled, SamplingSpec
from worker.backends.batching import Batch, Call, CallQueue

pytestmark = pytest.mark.timeout(30)

RUN = str(uuid.UUID(int=3))


def call(n_prompts: int, g: int, version: int | None = None, tokens: int = 8) -> Call:
    adapter = None if version is None else AdapterHandle(RUN, version, "0" * 64, Path("/x"))
    return Call([[1, 2]] * n_prompts, g, SamplingSpec(1.0, tokens, 0), adapter, threading.Event())


def segments(batch: Any) -> list[tuple[Call, int, int]]:
    assert isinstance(batch, Batch)
    return batch.segments


def answer(batch: Batch) -> list[Completion]:
    return [Completion(c.rows[i][0], c.rows[i][1], [i], [0.0], "length") for c, i in batch.rows]


def test_batches_take_the_oldest_calls_key_up_to_max_rows() -> None:
    queue = CallQueue(max_rows=4)
    a, b, c, d = call(1, 3, 1), call(1, 2, 2), call(1, 3, 1), call(1, 1, 1, tokens=9)
    for x in (a, b, c, d):
        queue.submit(x)
    # a's rows, topped up with c's (same adapter and sampling); b and d are of other keys.
    assert segments(queue.next_work()) == [(a, 0, 3), (c, 0, 1)]
    assert segments(queue.next_work()) == [(b, 0, 2)]
    assert segments(queue.next_work()) == [(c, 1, 3)]
    assert segments(queue.next_work()) == [(d, 0, 1)]
    assert queue.queued_calls == 0


def test_a_call_returns_when_all_its_rows_are_answered_in_order() -> None:
    queue = CallQueue(max_rows=2)
    a = call(2, 2, 1)
    queue.submit(a)
    assert queue.pinned((RUN, 1))
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(queue.wait(a)))
    waiter.start()
    for _ in range(2):
        batch = queue.next_work()
        assert isinstance(batch, Batch)
        queue.deliver(batch, answer(batch))
    waiter.join(5)
    assert [(c.prompt_index, c.group_index) for c in results[0]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert not queue.pinned((RUN, 1))


def test_cancel_withdraws_queued_rows_and_releases_the_pin() -> None:
    queue = CallQueue(max_rows=1)
    a, b = call(1, 2, 1), call(1, 1, 1)
    queue.submit(a)
    queue.submit(b)
    running = queue.next_work()  # a's first row is in a batch
    assert isinstance(running, Batch)
    a.cancel.set()
    with pytest.raises(GenerationCancelled):
        queue.wait(a)
    assert queue.pinned((RUN, 1))  # b still uses the version
    queue.deliver(running, answer(running))  # the late row of a is dropped
    assert a.results == [None, None]
    assert segments(queue.next_work()) == [(b, 0, 1)]  # a's second row was withdrawn


def test_a_failed_batch_fails_each_of_its_calls_with_its_own_error() -> None:
    queue = CallQueue(max_rows=4)
    a, b, c = call(1, 1, 1), call(1, 1, 1), call(1, 1, 2)
    for x in (a, b, c):
        queue.submit(x)
    batch = queue.next_work()
    assert isinstance(batch, Batch)
    queue.fail(batch, lambda: EngineFault("out of memory"))
    for x in (a, b):
        with pytest.raises(EngineFault):
            queue.wait(x)
    assert a.error is not b.error
    assert not c.done.is_set() and queue.pinned((RUN, 2))


def test_tasks_run_before_batches_and_close_refuses_work() -> None:
    queue = CallQueue(max_rows=4)
    a = call(1, 1)
    queue.submit(a)
    out: list[Any] = []
    loader = threading.Thread(target=lambda: out.append(queue.run_on_engine(lambda: 42)))
    loader.start()
    while not queue._tasks:
        threading.Event().wait(0.01)
    task = queue.next_work()
    assert not isinstance(task, Batch) and task is not None
    CallQueue.run_task(task)
    loader.join(5)
    assert out == [42]
    queue.close(EngineFault("closed"))
    with pytest.raises(EngineFault):
        queue.wait(a)
    assert queue.next_work() is None
    with pytest.raises(EngineFault):
        queue.submit(call(1, 1))
