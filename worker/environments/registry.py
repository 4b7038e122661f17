"""Which environment class a run's `environment.name` means on this worker.

Built-ins always; user environments and `verifiers:<module>` only from the worker operator's
allowlist (protocol.environments.EnvironmentAllowlist: `ASYNCGRPO_WORKER_ENVIRONMENT_MODULES`
and entry points of the group `asyncgrpo.environments`). Nothing outside it is imported,
whatever the run names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING

from protocol.environments import (
    BUILTINS_ONLY,
    ENTRY_POINT_GROUP,
    EnvironmentAllowlist,
    check_name,
    verifiers_module,
)
from worker.environments.base import Environment, EnvironmentSetupError
from worker.environments.guess_number import GuessNumberEnvironment
from worker.environments.single_turn import SingleTurnEnvironment
from worker.environments.tool_calls import ToolCallsEnvironment

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from protocol.environments import EnvironmentConfig
    from worker.environments.sandbox import ToolSandbox

BUILTINS: dict[str, type[Environment]] = {
    cls.name: cls for cls in (SingleTurnEnvironment, ToolCallsEnvironment, GuessNumberEnvironment)
}


def resolve(name: str, allowed: EnvironmentAllowlist = BUILTINS_ONLY) -> type[Environment]:
    """The class for a built-in, an allowed entry point or `module:Class` of an allowed module;
    EnvironmentSetupError (and nothing imported) for anything else."""
    if name in BUILTINS:
        return BUILTINS[name]
    try:
        check_name(name)
    except ValueError as exc:
        raise EnvironmentSetupError(str(exc)) from None
    if not allowed.allows(name):
        raise EnvironmentSetupError(
            f"environment {name!r} is not allowed on this worker: its operator allows modules "
            "in ASYNCGRPO_WORKER_ENVIRONMENT_MODULES and entry points "
            f"of the group {ENTRY_POINT_GROUP!r}"
        )
    if verifiers_module(name) is not None:
        from worker.environments.verifiers_env import VerifiersEnvironment

        return VerifiersEnvironment  # imports the module when built (make_environment)
    if name in allowed.entry_points:
        value = allowed.entry_points[name]
        try:
            found = importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP).load()
        except (ImportError, AttributeError) as exc:
            why = f"cannot load environment {name!r} ({value}): {exc}"
            raise EnvironmentSetupError(why) from exc
    else:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EnvironmentSetupError(f"cannot import {module_name!r}: {exc}") from exc
        found = getattr(module, attr, None)
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise EnvironmentSetupError(f"environment {name!r} is not an Environment subclass")
    return found


def make_environment(
    config: EnvironmentConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_model_len: int,
    sandbox: ToolSandbox | None = None,
    allowed: EnvironmentAllowlist = BUILTINS_ONLY,
) -> Environment:
    cls = resolve(config.name, allowed)
    return cls(config, tokenizer, max_model_len=max_model_len, sandbox=sandbox)
