"""A scripted policy: a TurnEngine that emits known token sequences and records its inputs.

Each turn's reply is a callable of the decoded input text (or a fixed text); its tokens are the
tokenizer's encoding of the text plus EOS (or given token ids), and its log-probs are distinct
values (-(k + 1) / 1000 for the k-th token emitted), so misalignment shows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.environments.base import Generated

Reply = str | list[int] | Callable[[str], str]


@dataclass
class ScriptedEngine:
    tokenizer: Any
    replies: list[Reply]
    eos: bool = True
    inputs: list[list[int]] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)
    outputs: list[Generated] = field(default_factory=list)
    emitted: int = 0

    def generate(self, token_ids: Sequence[int], max_new_tokens: int) -> Generated:
        self.inputs.append(list(token_ids))
        self.limits.append(max_new_tokens)
        reply = self.replies[min(len(self.outputs), len(self.replies) - 1)]
        if callable(reply):
            reply = reply(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))
        if isinstance(reply, str):
            ids = list(self.tokenizer(reply, add_special_tokens=False)["input_ids"])
        else:
            ids = list(reply)
        if self.eos:
            ids.append(int(self.tokenizer.eos_token_id))
        ids = ids[:max_new_tokens]
        stopped = self.eos and ids[-1] == self.tokenizer.eos_token_id
        lps = [-(self.emitted + k + 1) / 1000 for k in range(len(ids))]
        self.emitted += len(ids)
        out = Generated(ids, lps, "stop" if stopped else "length")
        self.outputs.append(out)
        return out


def assert_token_exact(trajectory: Any, engine: ScriptedEngine) -> None:
    """Every engine input is the trajectory's prefix up to that model turn, every output is the
    model span's tokens and log-probs, and the mask is 1 exactly there."""
    model_spans = [s for s in trajectory.spans if s.kind == "model"]
    assert len(model_spans) == len(engine.inputs) == len(engine.outputs)
    for span, given, out in zip(model_spans, engine.inputs, engine.outputs, strict=True):
        assert given == trajectory.token_ids[: span.start]
        assert trajectory.token_ids[span.start : span.end] == out.token_ids
        assert trajectory.logprobs[span.start : span.end] == out.logprobs
    trained = {i for s in model_spans for i in range(s.start, s.end)}
    assert [i for i, m in enumerate(trajectory.loss_mask) if m] == sorted(trained)
    assert all((lp is None) == (i not in trained) for i, lp in enumerate(trajectory.logprobs))


def span_text(tokenizer: Any, trajectory: Any, kind: str) -> list[str]:
    return [
        tokenizer.decode(trajectory.token_ids[s.start : s.end], skip_special_tokens=False)
        for s in trajectory.spans
        if s.kind == kind
    ]
