"""Concurrent `generate` calls gathered into forward batches for one engine thread.

Each caller thread submits a `Call` (its rows: every (prompt, group) pair) and waits; the engine
thread takes whatever is queued when it becomes free (no waiting for more) and forms a batch
from the oldest call's key — adapter (run, version) and sampling (temperature, max_new_tokens) —
topped up with rows of later calls of the same key, up to `max_rows`. Other work for the engine
(adapter loads) is run before the next batch. A call's adapter is pinned from submission until
the call leaves (done, failed or abandoned on cancel), so the engine never evicts it meanwhile.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.backends.base import Completion, EngineFault, GenerationCancelled, SamplingSpec

if TYPE_CHECKING:
    from worker.adapters import AdapterHandle

AdapterKey = tuple[str, int]
BatchKey = tuple[AdapterKey | None, float, int]

CANCEL_POLL_S = 0.02  # how often a waiting caller looks at its cancel event


@dataclass(eq=False)
class Call:
    """One `generate` call: `group_size` rows per prompt, answered in (prompt, group) order."""

    prompts: Sequence[Sequence[int]]
    group_size: int
    sampling: SamplingSpec
    adapter: AdapterHandle | None
    cancel: threading.Event
    rows: list[tuple[int, int]] = field(init=False)
    results: list[Completion | None] = field(init=False)
    taken: int = 0  # rows handed to the engine so far
    left: int = field(init=False)  # rows not answered yet
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    finished: bool = False  # out of the queue, pin released
    rng_state: Any = None  # the engine's RNG state between this call's solo batches

    def __post_init__(self) -> None:
        self.rows = [(p, g) for p in range(len(self.prompts)) for g in range(self.group_size)]
        self.results = [None] * len(self.rows)
        self.left = len(self.rows)

    @property
    def adapter_key(self) -> AdapterKey | None:
        return None if self.adapter is None else self.adapter.key

    @property
    def key(self) -> BatchKey:
        return (self.adapter_key, self.sampling.temperature, self.sampling.max_new_tokens)


@dataclass(frozen=True)
class Batch:
    """Rows of one or more calls of one key: (call, first row, end row) segments."""

    segments: list[tuple[Call, int, int]]

    @property
    def calls(self) -> list[Call]:
        return [call for call, _start, _stop in self.segments]

    @property
    def rows(self) -> list[tuple[Call, int]]:
        return [(call, i) for call, start, stop in self.segments for i in range(start, stop)]

    @property
    def head(self) -> Call:
        return self.segments[0][0]


@dataclass(eq=False)
class _Task:
    """Work other than a batch, run on the engine thread (an adapter load)."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class CallQueue:
    """The hand-over between caller threads and the one engine thread."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._cv = threading.Condition()
        self._calls: list[Call] = []  # arrival order; each has rows not yet taken
        self._tasks: deque[_Task] = deque()
        self._pins: Counter[AdapterKey] = Counter()
        self._closed = False

    # -- caller side ---------------------------------------------------------------------------

    def submit(self, call: Call) -> None:
        with self._cv:
            if self._closed:
                raise EngineFault("the backend is closed")
            self._calls.append(call)
            if call.adapter_key is not None:
                self._pins[call.adapter_key] += 1
            self._cv.notify_all()

    def wait(self, call: Call) -> list[Completion]:
        """The call's completions once every row is answered; GenerationCancelled as soon as
        its cancel event is seen (rows still queued are withdrawn, rows in a running batch are
        stopped there by the engine), or the error its batch raised."""
        while not call.done.wait(CANCEL_POLL_S):
            if call.cancel.is_set():
                with self._cv:
                    self._finish(call)
                raise GenerationCancelled()
        if call.error is not None:
            raise call.error
        if call.cancel.is_set():
            raise GenerationCancelled()
        return [c for c in call.results if c is not None]

    def run_on_engine(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread before its next batch; its result or its error."""
        task = _Task(fn)
        with self._cv:
            if self._closed:
                raise EngineFault("the backend is closed")
            self._tasks.append(task)
            self._cv.notify_all()
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.result

    def pinned(self, key: AdapterKey) -> bool:
        """A queued or running call uses this adapter."""
        with self._cv:
            return self._pins[key] > 0

    @property
    def queued_calls(self) -> int:
        with self._cv:
            return len(self._calls)

    # -- engine side ---------------------------------------------------------------------------

    def next_work(self) -> Batch | _Task | None:
        """Blocks until there is a task or rows to run; None once closed."""
        with self._cv:
            while not self._closed and not self._tasks and not self._calls:
                self._cv.wait()
            if self._closed:
                return None
            if self._tasks:
                return self._tasks.popleft()
            return self._take_batch()

    def _take_batch(self) -> Batch:
        key = self._calls[0].key
        segments: list[tuple[Call, int, int]] = []
        room = self.max_rows
        for call in [c for c in self._calls if c.key == key]:
            if room == 0:
                break
            start = call.taken
            call.taken = min(len(call.rows), start + room)
            room -= call.taken - start
            segments.append((call, start, call.taken))
            if call.taken == len(call.rows):
                self._calls.remove(call)
        return Batch(segments)

    @staticmethod
    def run_task(task: _Task) -> None:
        try:
            task.result = task.fn()
        except BaseException as exc:  # handed to the caller, never kills the engine
            task.error = exc
        task.done.set()

    def deliver(self, batch: Batch, completions: list[Completion]) -> None:
        """Answer the batch's rows (in `batch.rows` order); calls whose last row this was are
        done. Rows of calls that already left (cancelled) are dropped."""
        with self._cv:
            for (call, i), completion in zip(batch.rows, completions, strict=True):
                if call.finished:
                    continue
                call.results[i] = completion
                call.left -= 1
                if call.left == 0:
                    self._finish(call)

    def fail(self, batch: Batch, error: Callable[[], BaseException]) -> None:
        """Every call with rows in the batch raises an `error()` (each its own)."""
        with self._cv:
            for call in batch.calls:
                if not call.finished:
                    call.error = error()
                    self._finish(call)

    def close(self, error: BaseException) -> None:
        """Refuse new work; queued calls and tasks raise `error`."""
        with self._cv:
            self._closed = True
            for call in list(self._calls):
                call.error = error
                self._finish(call)
            while self._tasks:
                task = self._tasks.popleft()
                task.error = error
                task.done.set()
            self._cv.notify_all()

    def _finish(self, call: Call) -> None:
        """The call leaves: out of the queue, its pin released, its waiter woken (once)."""
        if call.finished:
            return
        call.finished = True
        if call in self._calls:
            self._calls.remove(call)
        key = call.adapter_key
        if key is not None:
            self._pins[key] -= 1
            if self._pins[key] == 0:
                del self._pins[key]
        call.done.set()
