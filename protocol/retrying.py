"""The one retry policy of the worker, the learner and the typed client, on tenacity:
exponential backoff with full jitter, capped — the n-th wait (n = 1, 2, …) is uniform in
[0, min(cap_s, base_s × 2^(n-1))] — for as long as the failure is transient and the caller's
`before_attempt` (a stop or a lost lease raises there) lets it go on, or up to `attempts` tries."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import tenacity

T = TypeVar("T")


def _wait(base_s: float, cap_s: float) -> tenacity.wait_random_exponential:
    return tenacity.wait_random_exponential(multiplier=base_s, max=cap_s)


def retry_call(
    call: Callable[[], T],
    *,
    transient: Callable[[BaseException], bool],
    base_s: float,
    cap_s: float,
    sleep: Callable[[float], None],
    before_attempt: Callable[[], None] = lambda: None,
    on_retry: Callable[[BaseException, float], None] = lambda _exc, _delay: None,
    attempts: int | None = None,
) -> T:
    """`call()` until it answers; a failure that is not `transient`, or the last of `attempts`
    tries (None: no bound), is raised as it is."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None and state.next_action is not None
        exc = state.outcome.exception()
        assert exc is not None
        on_retry(exc, state.next_action.sleep)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(transient),
        wait=_wait(base_s, cap_s),
        stop=tenacity.stop_never if attempts is None else tenacity.stop_after_attempt(attempts),
        sleep=sleep,
        before=lambda _state: before_attempt(),
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(call)


class Backoff:
    """The same waits for a loop that is not one call's retries (polling while idle, engine
    restarts, upload rounds): `next_delay()` is the next wait, `reset()` starts again."""

    def __init__(self, base_s: float = 0.25, cap_s: float = 10.0) -> None:
        self._wait = _wait(base_s, cap_s)
        self.attempt = 0

    def next_delay(self) -> float:
        self.attempt += 1
        state: Any = SimpleNamespace(attempt_number=self.attempt)  # all the wait reads
        return float(self._wait(state))

    def reset(self) -> None:
        self.attempt = 0
