"""The planner's learner memory (protocol/learner_memory.py) against what the learner's
FSDP2 sharding (learner/distributed.py, `DataParallel.shard`) really leaves on each of two gloo
ranks, for tiny bf16 Qwen2-, Llama- and Qwen3-shaped models built from their Hugging Face
configs (so the planner's shape from a config.json is checked against the real modules too): the
decoder layers' base weights are split, the embeddings, head, final norm and the LoRA state stay
whole. The planner adds two unsharded layers in flight on top, which a rank at rest does not
hold."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch.multiprocessing as mp

from protocol.learner_memory import (
    BYTES_BASE,
    BYTES_LORA_STATE,
    GB,
    TARGETS,
    learner_memory,
    lora_parameters,
    shape_from_hf_config,
)
from tests.s3_fixtures import free_port
from tests.server.dashboard import fsdp_ranks

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("fsdp-plan")
    mp.spawn(fsdp_ranks.rank_main, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("model", ["qwen2", "llama", "qwen3"])
def test_fsdp_estimate_matches_what_the_learner_shards(
    ranks: list[dict[str, Any]], model: str
) -> None:
    report = ranks[0][model]
    assert ranks[1][model] == report  # both ranks hold the same amounts
    shape = shape_from_hf_config(report["config"], model)
    lora = lora_parameters(shape, fsdp_ranks.RANK_LORA, TARGETS["all-linear"])
    # The trainable parameters are the LoRA weights the planner counts, fp32, never sharded.
    assert report["unsharded"]["trainable"] == report["sharded"]["trainable"] == lora
    assert report["sharded"]["trainable_dtypes"] == ["torch.float32"]
    single = learner_memory(shape, lora, 1, gpus=2, fsdp=False, checkpointing=False)
    assert single.weights * GB == pytest.approx(report["unsharded"]["frozen_bytes"])
    fsdp = learner_memory(shape, lora, 1, gpus=2, fsdp=True, checkpointing=False)
    in_flight = 2 * BYTES_BASE * shape.layer_parameters()
    assert fsdp.weights * GB - in_flight == pytest.approx(report["sharded"]["frozen_bytes"])
    assert fsdp.lora_state * GB == single.lora_state * GB == BYTES_LORA_STATE * lora
    # What stays whole is not nothing: a planner that divided every weight would be wrong.
    everything_halved = BYTES_BASE * shape.parameters() / 2
    assert report["sharded"]["frozen_bytes"] > everything_halved
