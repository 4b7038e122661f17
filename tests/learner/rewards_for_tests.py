"""Reward functions the reward-pool tests name as `tests.learner.rewards_for_tests:<name>`: the
child processes import them by name, as they import a run's user rewards."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any


def pid(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
    """The scoring process's id (tells a fresh child from the warm one)."""
    return [float(os.getpid())] * len(completions)


def sleepy(
    prompts: Sequence[Any], completions: Sequence[str], when: str = "sleep", **_: Any
) -> list[float | None]:
    """Hangs (an hour) on a batch with a completion containing `when`; else 1.0."""
    if any(when in c for c in completions):
        time.sleep(3600)
    return [1.0] * len(completions)


def flaky(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
    """Raises on a batch with a completion containing "boom"; else 0.5."""
    if any("boom" in c for c in completions):
        raise ValueError("boom in a completion")
    return [0.5] * len(completions)


class _Alarm(Exception):
    pass


def _ring(signum: int, frame: Any) -> None:
    raise _Alarm


def by_alarm(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
    """The length of each completion, computed under a SIGALRM guard as math-verify does: the
    handler can only be installed from a process's main thread."""
    previous = signal.signal(signal.SIGALRM, _ring)
    signal.alarm(5)
    try:
        return [float(len(c)) for c in completions]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def dies(prompts: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
    """The process exits abruptly on a completion containing "die"; else 0.0."""
    if any("die" in c for c in completions):
        os._exit(3)
    return [0.0] * len(completions)


def slow(
    prompts: Sequence[Any], completions: Sequence[str], seconds: float = 1.0, **_: Any
) -> list[float | None]:
    """Takes `seconds`, then 1.0."""
    time.sleep(seconds)
    return [1.0] * len(completions)


def transcript_score(
    prompts: Sequence[Any],
    completions: Sequence[str],
    transcript: Sequence[Any] = (),
    info: Sequence[Any] = (),
    answer: Sequence[Any] = (),
    **_: Any,
) -> list[float | None]:
    """Tool results the transcript shows, + 10 when the model's text holds the answer, + 100
    when `info` is a dict (what a multi-turn reward reads)."""
    return [
        sum(m["kind"] == "tool_result" for m in t)
        + (10.0 if str(a) in c else 0.0)
        + (100.0 if isinstance(i, dict) else 0.0)
        for c, t, i, a in zip(completions, transcript, info, answer, strict=True)
    ]
