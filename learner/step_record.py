"""What each trained step consumed, recorded (the learner's --record-steps-dir) and replayed.

A record is one JSON line a step in `<dir>/<run id>.jsonl`: the step, the version it joined,
its batches and their scored groups (token ids, behaviour log-probs, loss masks, rewards), in
the order the step trained them. `replay` trains the same steps, in the same order, into a
fresh per-run learner's adapter: a pool learner's run replayed so ends with the adapter the
pool published, to floating-point tolerance (tests/learner/test_pool_learner_many.py)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.data import Completion, Group
from protocol.run_config import RunConfig

_WRITE = threading.Lock()  # a pool learner's runs record from their own threads


@dataclass(frozen=True)
class RecordedStep:
    step: int
    version: int
    batch_ids: list[str]
    groups: list[Group]


def record_step(
    folder: Path,
    run_id: str,
    *,
    step: int,
    version: int,
    batch_ids: Sequence[uuid.UUID],
    groups: Sequence[Group],
) -> None:
    line = {
        "step": step,
        "version": version,
        "batch_ids": [str(b) for b in batch_ids],
        "groups": [_group(g) for g in groups],
    }
    folder.mkdir(parents=True, exist_ok=True)
    with _WRITE, (folder / f"{run_id}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


def _group(group: Group) -> dict[str, Any]:
    return {
        "rewards": list(group.rewards),
        "completions": [
            {
                "prompt_ids": list(c.prompt_ids),
                "completion_ids": list(c.completion_ids),
                "behaviour_logprobs": list(c.behaviour_logprobs),
                "loss_mask": None if c.loss_mask is None else list(c.loss_mask),
            }
            for c in group.completions
        ],
    }


def read_steps(path: Path) -> list[RecordedStep]:
    steps = []
    for text in path.read_text().splitlines():
        line = json.loads(text)
        groups = [
            Group([Completion(**c) for c in g["completions"]], g["rewards"]) for g in line["groups"]
        ]
        steps.append(RecordedStep(line["step"], line["version"], line["batch_ids"], groups))
    return steps


def replay(config: RunConfig, steps: Sequence[RecordedStep], *, pad_id: int, model: Any) -> Any:
    """Train `steps` in order into a fresh adapter on `model` (a base model, wrapped here as a
    per-run learner wraps it); returns the Trainer."""
    from learner.trainer import Trainer, add_lora

    trainer = Trainer(add_lora(model, config), config, pad_id=pad_id)
    for recorded in steps:
        trainer.train_step(recorded.groups)
    return trainer
