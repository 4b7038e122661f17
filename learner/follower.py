"""A data-parallel learner rank other than 0 (learner/distributed.py): it never talks to the
server or the bucket. It waits for rank 0's messages — `session` (the run config: build the
model, then take rank 0's weights and optimizer state), `step` (this rank's share of the
step's sequences: run the same trainer step on it), `stop` (exit with rank 0's code)."""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from learner.config import LearnerSettings
from learner.distributed import DataParallel
from learner.trainer import Trainer, add_lora
from protocol.run_config import LearnerRunConfig

log = logging.getLogger(__name__)


def build_trainer(
    settings: LearnerSettings, dp: DataParallel, run_config: dict[str, Any], pad_id: int
) -> Trainer:
    """The session's model (a fresh adapter; rank 0's weights replace it), sharded like rank
    0's, and its trainer in rank 0's state."""
    from lm.models import load_model

    config = LearnerRunConfig.model_validate(run_config)
    torch.manual_seed(config.seed)
    base = load_model(config.base_model, dtype=getattr(torch, settings.dtype), device=dp.device)
    model = add_lora(base, config)
    if dp.fsdp:
        dp.shard(model)
    trainer = Trainer(model, config, pad_id=pad_id, device=dp.device, dp=dp)
    dp.share_trainer_state(trainer)
    return trainer


def follow(settings: LearnerSettings, dp: DataParallel) -> int:
    """Serve rank 0 until it says stop; returns its exit code."""
    from lm.models import load_tokenizer, set_threads

    set_threads(settings.threads)
    tokenizer = load_tokenizer(settings.model)
    pad = tokenizer.pad_token_id
    pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
    trainer: Trainer | None = None
    while True:
        kind, payload = dp.receive()
        if kind == "stop":
            log.info("rank 0 stopped (exit code %s)", payload)
            return int(payload)
        if kind == "session":
            trainer = None
            gc.collect()
            trainer = build_trainer(settings, dp, payload, pad_id)
            log.info("rank %d joined the session at step %d", dp.rank, trainer.step)
        elif kind == "step":
            if trainer is None:
                raise RuntimeError("a step before any session")
            trainer.train_share(payload)
        else:
            raise RuntimeError(f"unknown message {kind!r} from rank 0")
