"""The learner's memory (protocol/learner_memory.py): LoRA parameters of a run config's target
modules, activations in the learner's dtype, and the pool rule with its reasons, against
figures worked out by hand for SmolLM2-135M (the small model): 30 layers, hidden 576,
MLP 1536, 9 heads, 3 KV heads (head dim 64, KV width 192), vocabulary 49,152, tied embeddings.

Parameters of one layer: q, o 576·576 = 331,776 each; k, v 576·192 = 110,592 each; gate, up,
down 576·1536 = 884,736 each; two norms 1,152: 3,540,096. All: 30 · 3,540,096 = 106,202,880,
embeddings 49,152 · 576 = 28,311,552, final norm 576: P = 134,515,008. Base weights in bf16
2·P = 269,030,016 B, with the pool's 1 GB overhead 1,269,030,016 B.
Activations per token and layer, bf16: 2·(4·576 + 2·576 + 2·192 + 4·1536) = 2·9,984 = 19,968 B;
30 layers 599,040 B; with checkpointing 2·30·576 + 19,968 = 54,528 B. Logits 4·49,152 =
196,608 B per token.
"""

from __future__ import annotations

import pytest

from protocol.learner_memory import (
    POOL_OVERHEAD_BYTES,
    ModelShape,
    RunNeed,
    activation_bytes_per_token,
    lora_parameters,
    pool_fit,
    pool_need,
    run_need,
)
from protocol.run_config import RunConfig
from protocol.schemas_learner import LearnerMemory
from tests.harness.runs import run_config

SHAPE = ModelShape("SmolLM2-135M", 30, 576, 1536, 9, 3, 49152, True, False)
BASE = 1_269_030_016  # bf16 weights and the overhead
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]  # the run config's default targets
# rank 16 on q, k, v, o: 16 · (1152 + 768 + 768 + 1152) · 30 = 1,843,200 params, 29,491,200 B
A = RunNeed(16, tuple(ATTENTION), 4096, False)
# rank 16 on all linear: 16 · (3840 + 3 · 2112) · 30 = 4,884,480 params, 78,151,680 B
B = RunNeed(16, ("all-linear",), 1024, True)
# rank 8 on q, v: 8 · (1152 + 768) · 30 = 460,800 params, 7,372,800 B
C = RunNeed(8, ("q_proj", "v_proj"), 8192, False)


def test_the_base_is_the_planners_shape() -> None:
    assert SHAPE.layer_parameters() == 3_540_096 and SHAPE.parameters() == 134_515_008
    assert 2 * SHAPE.parameters() + POOL_OVERHEAD_BYTES == BASE


def test_lora_parameters_of_target_module_names() -> None:
    assert lora_parameters(SHAPE, 16, ATTENTION) == 1_843_200
    assert lora_parameters(SHAPE, 16, ["all-linear"]) == 4_884_480
    # PEFT matches a name's end: a dotted path counts as its module; a repeat counts once
    assert lora_parameters(SHAPE, 8, ["self_attn.q_proj", "v_proj", "q_proj"]) == 460_800
    # another architecture's name: the widest module (gate, up, down: 576 + 1536), 16·2112·30
    assert lora_parameters(SHAPE, 16, ["c_attn"]) == 1_013_760


def test_activations_in_the_learners_dtype() -> None:
    assert activation_bytes_per_token(SHAPE, False) == 599_040
    assert activation_bytes_per_token(SHAPE, True) == 54_528
    assert activation_bytes_per_token(SHAPE, False, 4) == 2 * 599_040  # --dtype float32


def test_a_pool_needs_the_base_once_each_lora_state_and_the_largest_step() -> None:
    # A: 4096 · (599,040 + 196,608) = 3,258,974,208 B of activations and logits
    assert pool_need(SHAPE, []) == BASE
    assert pool_need(SHAPE, [A]) == BASE + 29_491_200 + 3_258_974_208
    # B's step, 1024 · (54,528 + 196,608) = 257,163,264 B, is smaller than A's: only its LoRA
    # state adds
    assert pool_need(SHAPE, [A, B]) == BASE + 29_491_200 + 78_151_680 + 3_258_974_208
    # C's step, 8192 · 795,648 = 6,517,948,416 B, is the largest of the three
    assert pool_need(SHAPE, [A, B, C]) == (
        BASE + 29_491_200 + 78_151_680 + 7_372_800 + 6_517_948_416
    )
    # float32 base and activations: 4·P + overhead, A's step 4096 · (1,198,080 + 196,608)
    assert pool_need(SHAPE, [A], 4) == 4 * 134_515_008 + 10**9 + 29_491_200 + 5_712_642_048


def test_the_fit_and_its_reasons() -> None:
    held_a = BASE + 29_491_200 + 3_258_974_208  # 4,557,495,424 B
    assert pool_fit(SHAPE, 16e9, [A], C) == (True, "")
    assert pool_fit(SHAPE, held_a, [], A) == (True, "")  # exactly the budget fits
    # C beside A: 7,823,842,432 − 4,557,495,424 = 3,266,347,008 B more; 6 GB − 4,557,495,424
    # = 1,442,504,576 B left
    assert pool_fit(SHAPE, 6e9, [A], C) == (
        False,
        "needs 3.3 GB more beside the 1 run(s) it holds, 1.4 GB left of the 6.0 GB budget",
    )
    # B beside A adds its LoRA state only: 78,151,680 B; 42,504,576 B left of 4.6 GB
    assert pool_fit(SHAPE, 4.6e9, [A], B).reason == (
        "needs 78 MB more beside the 1 run(s) it holds, 43 MB left of the 4.6 GB budget"
    )
    # nothing held: A needs 3,288,465,408 B beyond the base, 2,730,969,984 B left of 4 GB
    assert (
        pool_fit(SHAPE, 4e9, [], A).reason == "needs 3.3 GB more, 2.7 GB left of the 4.0 GB budget"
    )
    assert pool_fit(SHAPE, 1e9, [], A) == (
        False,
        "the base model's weights and the overhead alone need 1.3 GB, over the 1.0 GB memory "
        "budget",
    )


def test_a_runs_need_comes_from_its_config() -> None:
    config = RunConfig.model_validate(
        run_config(
            {"name": "r"},
            lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]},
            grpo={"micro_batch_tokens": 8192, "gradient_checkpointing": True},
        )
    )
    assert run_need(config) == RunNeed(8, ("q_proj", "v_proj"), 8192, True)


def test_the_wire_memory_carries_the_shape() -> None:
    sent = LearnerMemory.of(SHAPE, budget_gb=16, weight_bytes=4)
    assert sent.shape(SHAPE.name) == SHAPE
    assert LearnerMemory.model_validate_json(sent.model_dump_json()) == sent


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kv_heads": 2}, "kv_heads"),  # 9 heads: 2 does not divide them
        ({"hidden": 577}, "head_dim"),  # 9 does not divide 577 and no head_dim
        ({"weight_bytes": 3}, "weight_bytes"),
        ({"budget_gb": float("nan")}, "budget_gb"),
    ],
)
def test_the_wire_memory_refuses_a_shape_the_arithmetic_cannot_use(
    change: dict[str, object], field: str
) -> None:
    from pydantic import ValidationError

    body = LearnerMemory.of(SHAPE, budget_gb=16, weight_bytes=2).model_dump() | change
    with pytest.raises(ValidationError) as refused:
        LearnerMemory.model_validate(body)
    assert [e["loc"][0] for e in refused.value.errors()] == [field]
