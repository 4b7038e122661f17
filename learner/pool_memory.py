"""A pool learner's memory (docs/guides/pool-learners.md, "Memory"): the payload every take
sends (its budget, its dtype's width and its base model's shape from the model's config.json),
and the runs a take left because they do not fit, logged once per run. The rule itself is
protocol/learner_memory.py `pool_fit`, applied by the server's take."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable

from learner.config import LearnerSettings
from protocol.learner_memory import GB, ModelShape, shape_from_hf_config
from protocol.schemas_learner import MAX_MEMORY_BUDGET_GB, LearnerMemory, LeftRun

log = logging.getLogger("learner")

WEIGHT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_shape(model: str) -> ModelShape:
    """The base model's shape from its config.json (alias, folder or Hub id, as lm/models.py
    resolves it); ValueError when it is not a decoder-only shape the arithmetic knows."""
    from transformers import AutoConfig

    from lm.models import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model)).to_dict()
    return shape_from_hf_config(config, model)


def device_memory_gb(device: str, fraction: float | None = None) -> float:
    """The device's total memory, GB: a CUDA device's (times `fraction`, the share its torch
    allocator may take), else the machine's physical memory."""
    if device.startswith("cuda"):
        import torch

        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return float(total) * (fraction or 1.0) / GB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB


def budget_gb(settings: LearnerSettings) -> float:
    """--memory-budget, else the device's memory."""
    if settings.memory_budget is not None:
        return settings.memory_budget
    return device_memory_gb(settings.device, settings.gpu_memory_fraction)


def take_memory(settings: LearnerSettings) -> LearnerMemory | None:
    """What every take sends; None (takes without a memory check, said once) when the model's
    shape cannot be read."""
    try:
        shape = model_shape(settings.model)
    except (OSError, ValueError) as exc:
        log.warning(
            "no memory check on takes: the shape of %s is unknown (%s)", settings.model, exc
        )
        return None
    budget = min(budget_gb(settings), MAX_MEMORY_BUDGET_GB)  # a machine beyond the bound
    weight_bytes = WEIGHT_BYTES[settings.dtype]
    log.info("taking runs that fit %.1f GB (%s, %s)", budget, settings.model, settings.dtype)
    return LearnerMemory.of(shape, budget_gb=budget, weight_bytes=weight_bytes)


def log_left(left: Iterable[LeftRun], said: set[uuid.UUID]) -> None:
    """Each run a take left, with the reason, once per run (`said` keeps which)."""
    for run in left:
        if run.run_id not in said:
            said.add(run.run_id)
            log.info("left run %s for another learner: %s", run.run_id, run.reason)
