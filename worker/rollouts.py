"""Leases of a multi-turn run: the run's environment rolled out for every prompt × G, each
trajectory on a `BackendTurnEngine` with the lease's adapter version from its first turn to its
last (docs/architecture/environments.md, "Environments and trajectories").

The trajectories of a lease run in parallel threads, so that the backend batches their turns as
it batches a single-turn lease's completions. Every turn passes the lease's cancel event (an
abort, a lost lease or a shutdown stops the rollout at its next turn, or in the middle of one).
A rollout's environment randomness is seeded per prompt (the G trajectories of a prompt face the
same task: guess_number's secret), its sampling per trajectory.

An environment that fails a rollout (its code raises, a template that cannot be extended turn by
turn, a trajectory that breaks the format) raises `RolloutFailed`: the lease is released
`environment_error`, counting an attempt on its prompts (a failure that repeats drops them
after max_attempts rather than cycling), and the worker goes on.

A prompt that leaves no room for a model turn within `max_total_tokens` raises `PromptsTooLong`
naming its rows: the lease is released with reason `prompt_too_long`, which counts an attempt on
those rows only (so they are dropped after max_attempts instead of coming back forever), and
the lease's other prompts go back to the queue unpunished.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from lm.chat import chat_messages
from protocol.batch_format import TrajectorySample
from protocol.environments import (
    BUILTIN_ENVIRONMENTS,
    SINGLE_TURN,
    TOOL_CALLS,
    EnvironmentAllowlist,
    EnvironmentConfig,
)
from protocol.seeds import derived_seed
from worker.backends.base import EngineFault, GenerationCancelled
from worker.environments.backend_engine import BackendTurnEngine
from worker.environments.base import PromptTooLong
from worker.environments.registry import make_environment
from worker.prompts import plain_prompt

if TYPE_CHECKING:
    from protocol.schemas import Lease
    from worker.adapters import AdapterHandle
    from worker.backends.base import Backend
    from worker.environments.base import Environment
    from worker.environments.sandbox import ToolSandbox

log = logging.getLogger(__name__)
MAX_PARALLEL_TRAJECTORIES = 64


class RolloutFailed(Exception):
    """The environment failed a rollout (its code raised, a template that cannot be extended
    turn by turn, a trajectory that breaks the format): the lease is released
    `environment_error`, which counts an attempt on its prompts."""


class PromptsTooLong(Exception):
    """Prompts of a lease that leave no room for a model turn within max_total_tokens."""

    def __init__(self, prompt_row_ids: list[int], detail: str) -> None:
        super().__init__(f"prompt rows {prompt_row_ids}: {detail}")
        self.prompt_row_ids = prompt_row_ids


def environment_of(lease: Lease) -> EnvironmentConfig:
    """The lease's environment (a server from before environments sends none: single_turn)."""
    if lease.environment is None:
        return EnvironmentConfig()
    return EnvironmentConfig.model_validate(lease.environment)


def is_multi_turn(lease: Lease) -> bool:
    """Trajectories (batch format 2), or today's single-turn path (format 1)."""
    return lease.environment is not None and lease.environment.get("name") != SINGLE_TURN


class EnvironmentRollouts:
    """Builds a run's environment once (per environment config) and rolls out leases with it.
    The tool sandbox starts with the first environment that calls tools; `close()` stops it."""

    def __init__(
        self,
        backend: Backend,
        *,
        allowed: EnvironmentAllowlist,
        tool_memory_mb: int = 512,
        tool_processes: int = 1,
    ) -> None:
        self.backend = backend
        self.allowed = allowed
        self.tool_memory_mb = tool_memory_mb
        self.tool_processes = tool_processes
        self._environments: dict[str, Environment] = {}
        self._sandbox: ToolSandbox | None = None
        self._lock = threading.Lock()

    def environment(self, config: EnvironmentConfig) -> Environment:
        """EnvironmentSetupError when this worker cannot run it (not allowed, limits above the
        engine's max_model_len, a missing tool)."""
        key = config.model_dump_json()
        with self._lock:
            env = self._environments.get(key)
            if env is None:
                env = make_environment(
                    config,
                    self.backend.tokenizer,
                    max_model_len=self.backend.max_model_len,
                    sandbox=self._sandbox_for(config),
                    allowed=self.allowed,
                )
                self._environments[key] = env
            return env

    def _sandbox_for(self, config: EnvironmentConfig) -> ToolSandbox | None:
        if config.name != TOOL_CALLS and config.name in BUILTIN_ENVIRONMENTS:
            return None
        if self._sandbox is None:
            from worker.environments.sandbox import ToolSandbox

            self._sandbox = ToolSandbox(
                processes=self.tool_processes, memory_mb=self.tool_memory_mb
            )
        return self._sandbox

    def rollout(
        self, lease: Lease, adapter: AdapterHandle | None, cancel: threading.Event
    ) -> list[TrajectorySample]:
        """Every prompt × G trajectory of the lease, in (prompt, group index) order."""
        env = self.environment(environment_of(lease))
        jobs = [(i, g) for i in range(len(lease.prompts)) for g in range(lease.group_size)]
        with ThreadPoolExecutor(
            max_workers=min(len(jobs), MAX_PARALLEL_TRAJECTORIES),
            thread_name_prefix=f"rollout-{str(lease.lease_id)[:8]}",
        ) as pool:
            futures = [pool.submit(self._one, env, lease, i, g, adapter, cancel) for i, g in jobs]
            outcomes: list[Any] = []
            for future in futures:
                try:
                    outcomes.append(future.result())
                except Exception as exc:  # every trajectory ends first; then the worst wins
                    outcomes.append(exc)
        _raise_failure(lease, jobs, outcomes)
        return list(outcomes)

    def _one(
        self,
        env: Environment,
        lease: Lease,
        i: int,
        g: int,
        adapter: AdapterHandle | None,
        cancel: threading.Event,
    ) -> TrajectorySample:
        prompt = lease.prompts[i]
        engine = BackendTurnEngine(
            self.backend,
            temperature=float(lease.sampling.get("temperature", 1.0)),
            seed=derived_seed(lease.seed, i, g),
            adapter=adapter,  # the lease's version, for every turn
            cancel=cancel,
        )
        trajectory = env.rollout(
            engine,
            chat_messages(plain_prompt(prompt.prompt), lease.system_prompt),
            max_new_tokens=lease.max_new_tokens,
            seed=derived_seed(lease.seed, i),
        )
        return TrajectorySample(prompt.prompt_row_id, g, trajectory)

    def close(self) -> None:
        with self._lock:
            if self._sandbox is not None:
                self._sandbox.close()
                self._sandbox = None
            self._environments.clear()


def _raise_failure(lease: Lease, jobs: list[tuple[int, int]], outcomes: list[Any]) -> None:
    """An engine death first (the engine restarts), then a cancel, then prompts too long, then
    anything else as RolloutFailed."""
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if not errors:
        return
    for kind in (EngineFault, GenerationCancelled):
        for exc in errors:
            if isinstance(exc, kind):
                raise exc
    too_long = sorted(
        {
            lease.prompts[i].prompt_row_id
            for (i, _g), o in zip(jobs, outcomes, strict=True)
            if isinstance(o, PromptTooLong)
        }
    )
    if too_long:
        first = next(o for o in outcomes if isinstance(o, PromptTooLong))
        raise PromptsTooLong(too_long, str(first))
    first_error = errors[0]
    log.error("lease %s: a rollout failed", lease.lease_id, exc_info=first_error)
    raise RolloutFailed(f"{type(first_error).__name__}: {first_error}") from first_error
