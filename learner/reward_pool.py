"""The run's reward functions in warm child processes, with a hard timeout per batch.

Rewards are user code: some hang, some need the main thread (SIGALRM-based timeouts, as in
math-verify), some import slow libraries. The learner scores in a pebble `ProcessPool`
(forkserver children: the learner has torch's threads running, so a plain fork is unsafe),
where each reward runs in a child's main thread. A reward that outlives the batch's time is
killed with its process (pebble: SIGTERM, then SIGKILL) and the pool starts a fresh child.

Two kinds of failure (docs/architecture/loss.md, "Rewards"):
- a reward that cannot be resolved (unknown name, a module or entry point outside the host's
  `RewardAllowlist`, a module that does not import) would stop every learner the same way:
  `RewardPool(...)` checks every name in a child and raises `RewardError`, which fails the run;
- a reward that raises, returns something unusable, dies or times out on one batch:
  `score` raises `RewardBatchFailed`, and the intake rejects that batch `reward_error`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from pebble import ProcessExpired, ProcessPool

from protocol.outbound import PUBLIC_ONLY, OutboundPolicy
from protocol.rewards import (
    BUILTINS,
    BUILTINS_ONLY,
    CombinedRewards,
    RewardAllowlist,
    RewardError,
    RewardSpecLike,
    check_aligned,
    resolve,
    score_one,
    weighted,
)
from protocol.rewards_judge import JudgeHost, use_host

log = logging.getLogger(__name__)

# Waiting in the parent past the child's own (pebble) timeout: a task may first wait for a
# fresh child to start and import the rewards, which the per-task timeout does not count.
START_TIMEOUT_S = 300.0


class RewardPoolClosed(Exception):
    """The pool was closed before or while scoring (the learner is stopping): not the batch's
    fault, so not a rejection."""


class RewardBatchFailed(Exception):
    """One reward could not score one batch (raised, unusable output, died, timed out)."""

    def __init__(self, reward: str, detail: str) -> None:
        super().__init__(f"reward {reward!r}: {detail}")
        self.reward = reward
        self.detail = detail


def _user_rewards(names: Sequence[str]) -> list[str]:
    return sorted({n for n in names if n not in BUILTINS})


def _warm(names: Sequence[str], allowed: RewardAllowlist) -> None:
    """Pool initializer: import the reward modules in each new child before its first batch.
    Errors are left to `_check` (an initializer that raises makes pebble restart the child in
    a loop)."""
    for name in names:
        try:
            resolve(name, allowed)
        except Exception:  # noqa: BLE001 - reported by _check, which runs next
            pass


def _check(names: Sequence[str], allowed: RewardAllowlist) -> None:
    for name in names:
        resolve(name, allowed)


def _check_judge_keys(specs: Sequence[RewardSpecLike]) -> None:
    """An `llm_judge` whose key variable is not set here would fail every batch: RewardError
    at start instead (the run fails with the reason)."""
    for spec in specs:
        env_name = spec.kwargs.get("api_key_env") if spec.name == "llm_judge" else None
        if isinstance(env_name, str) and not os.environ.get(env_name):
            raise RewardError(
                f"llm_judge: the environment variable {env_name} (its api_key_env) is not set "
                "where the learner runs"
            )


def _score_in_child(host: JudgeHost, *args: Any) -> list[float]:
    """`score_one` in a child, with the learner host's judge settings (`JudgeHost`): the
    child was forked from the forkserver, whose environment may predate the learner's."""
    use_host(host)
    return score_one(*args)


def _judge_host(spec: RewardSpecLike, policy: OutboundPolicy) -> JudgeHost:
    """The outbound policy, and the one environment variable an `llm_judge` names."""
    env_name = spec.kwargs.get("api_key_env") if spec.name == "llm_judge" else None
    environ = {}
    if isinstance(env_name, str) and env_name in os.environ:
        environ[env_name] = os.environ[env_name]
    return JudgeHost(policy=policy, environ=environ)


class RewardPool:
    """Scores completions with the run's rewards in `processes` warm child processes; one
    batch may take at most `timeout_s` of reward time (all its rewards together). The children
    load user rewards only from `allowed` (built-ins only by default); `outbound` is the
    policy the rewards' own outbound calls (`llm_judge`) go through."""

    def __init__(
        self,
        specs: Sequence[RewardSpecLike],
        *,
        timeout_s: float = 60.0,
        processes: int = 1,
        start_timeout_s: float = START_TIMEOUT_S,
        allowed: RewardAllowlist = BUILTINS_ONLY,
        outbound: OutboundPolicy = PUBLIC_ONLY,
    ) -> None:
        if timeout_s <= 0 or processes < 1:
            raise ValueError("timeout_s must be > 0 and processes >= 1")
        self.specs = list(specs)
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.allowed = allowed
        self.outbound = outbound
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future[Any]] = set()
        self._closed = False
        _check_judge_keys(self.specs)
        users = _user_rewards([s.name for s in self.specs])
        self._pool = ProcessPool(
            max_workers=processes,
            initializer=_warm,
            initargs=(users, allowed),
            context=multiprocessing.get_context("forkserver"),
        )
        try:
            self._check(users)
        except BaseException:
            self.close()
            raise

    def _check(self, names: list[str]) -> None:
        """Resolve every user reward in a child: RewardError (the run fails) when one cannot."""
        future = self._pool.submit(_check, self.start_timeout_s, names, self.allowed)
        try:
            future.result(timeout=2 * self.start_timeout_s)
        except RewardError:
            raise
        except ProcessExpired as exc:
            raise RewardError(f"the reward process died while importing {names}: {exc}") from exc
        except (TimeoutError, concurrent.futures.TimeoutError) as exc:
            future.cancel()
            raise RewardError(
                f"importing the rewards {names} took longer than {self.start_timeout_s:g} s"
            ) from exc
        except Exception as exc:  # a module that raises while it is imported
            raise RewardError(f"cannot import the rewards {names}: {_describe(exc)}") from exc

    def score(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, Sequence[Any]],
    ) -> CombinedRewards:
        """Every reward's values and the weighted total, or RewardBatchFailed."""
        check_aligned(prompts, completions, columns)
        args = (list(prompts), list(completions), {k: list(v) for k, v in columns.items()})
        deadline = time.monotonic() + self.timeout_s
        values = []
        for spec in self.specs:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RewardBatchFailed(spec.name, self._timed_out())
            values.append(self._run(spec, left, args))
        return weighted(self.specs, values, len(completions))

    def _timed_out(self) -> str:
        return f"the batch's rewards did not finish within {self.timeout_s:g} s (timeout)"

    def _run(self, spec: RewardSpecLike, left: float, args: tuple[Any, ...]) -> list[float]:
        with self._lock:
            if self._closed:
                raise RewardPoolClosed("the reward pool is closed")
            prompts, completions, columns = args
            future = self._pool.submit(
                _score_in_child,
                left,
                _judge_host(spec, self.outbound),
                spec.name,
                dict(spec.kwargs),
                prompts,
                completions,
                columns,
                self.allowed,
            )
            self._in_flight.add(future)
        try:
            return future.result(timeout=left + self.start_timeout_s)  # type: ignore[no-any-return]
        except Exception as exc:
            if self._closed:
                raise RewardPoolClosed("the reward pool was closed while scoring") from exc
            raise self._failure(spec, future, exc) from exc
        finally:
            with self._lock:
                self._in_flight.discard(future)

    def _failure(
        self, spec: RewardSpecLike, future: concurrent.futures.Future[Any], exc: Exception
    ) -> RewardBatchFailed:
        if isinstance(exc, TimeoutError | concurrent.futures.TimeoutError):
            future.cancel()  # pebble kills a cancelled task's child and starts a fresh one
            return RewardBatchFailed(spec.name, self._timed_out() + "; its process was killed")
        if isinstance(exc, ProcessExpired):
            return RewardBatchFailed(spec.name, f"its process died ({exc})")
        return RewardBatchFailed(spec.name, _describe(exc))

    def close(self) -> None:
        """Stop the children (a running reward is killed); a `score` in flight in another
        thread raises RewardPoolClosed at once."""
        with self._lock:
            self._closed = True
            in_flight = list(self._in_flight)
        self._pool.stop()
        for future in in_flight:  # a stopped pebble pool settles no more futures
            future.cancel()
        self._pool.join(timeout=10)

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RewardError):
        return str(exc)
    return f"raised {type(exc).__name__}: {exc}"
