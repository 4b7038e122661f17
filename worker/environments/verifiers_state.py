"""The verifiers 0.3.x rollout API: `MultiTurnEnv.rollout(input, client, model, sampling_args)
-> State`, where `client` is a verifiers `Client`. `engine_client` builds one whose
`get_response` is a model turn of the rollout's session (worker/environments/verifiers_env.py),
so the package's own MultiTurnEnv loop runs on the worker's engine in process. Imported only
when an environment with that API runs (the `verifiers` extra is installed then)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def engine_client(turn: Callable[[Sequence[Any], Mapping[str, Any]], tuple[str, str]]) -> Any:
    """A verifiers `Client` whose responses come from `turn(messages, sampling_args)` ->
    (content, finish_reason)."""
    from verifiers.legacy.clients.client import Client
    from verifiers.legacy.types import Response, ResponseMessage

    class EngineClient(Client):  # type: ignore[misc]
        async def get_response(
            self,
            prompt: Any,
            model: str,
            sampling_args: Any,
            tools: Any = None,
            **kwargs: Any,
        ) -> Any:
            if tools:
                raise NotImplementedError("native tool calls are not supported in process")
            content, finish = turn(prompt, dict(sampling_args or {}))
            message = ResponseMessage(
                content=content, finish_reason=finish, is_truncated=finish == "length"
            )
            return Response(id="asyncgrpo", created=int(time.time()), model=model, message=message)

        def setup_client(self, config: Any) -> Any:
            raise NotImplementedError("the in-process client has no network client")

        async def to_native_prompt(self, messages: Any) -> Any:
            raise NotImplementedError

        async def to_native_tool(self, tool: Any) -> Any:
            raise NotImplementedError

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def raise_from_native_response(self, response: Any) -> None:
            raise NotImplementedError

        async def from_native_response(self, response: Any) -> Any:
            raise NotImplementedError

        async def close(self) -> None:
            return None

    return EngineClient(object())


async def rollout_state(env: Any, client: Any, prompt: list[dict[str, str]], seed: int) -> Any:
    rollout_input = {"prompt": prompt, "example_id": seed, "answer": "", "info": {"seed": seed}}
    return await env.rollout(rollout_input, client, "asyncgrpo-worker", {})


async def score_state(env: Any, state: Any) -> float:
    await env.rubric.score_rollout(state)
    return float(state["reward"])
