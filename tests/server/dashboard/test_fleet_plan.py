"""The extended planner's formulas (server/dashboard/fleet_plan.py; its memory:
protocol/learner_memory.py) against numbers worked out by hand for Qwen2.5-1.5B: 28 layers,
hidden 1536, MLP 8960, 12 heads, 2 KV heads (head dim 128, KV width 256), vocabulary 151,936,
tied embeddings, q/k/v biases.

Parameters of one layer: q, o 1536·1536 = 2,359,296 each; k, v 1536·256 = 393,216 each; gate, up,
down 1536·8960 = 13,762,560 each; sum 46,792,704; two norms 3,072; biases 1536 + 2·256 = 2,048:
46,797,824. All: 28 · 46,797,824 = 1,310,339,072, embeddings 151,936 · 1536 = 233,373,696, final
norm 1,536: P = 1,543,714,304.
LoRA rank 16, all linear: per layer 16 · (3072 + 1792 + 1792 + 3072 + 3 · 10496) = 16 · 41,216
= 659,456; Lp = 28 · 659,456 = 18,464,768.
"""

from __future__ import annotations

import pytest

from protocol.learner_memory import learner_memory
from server.dashboard.fleet_plan import FleetInputs, Gpu, fleet_row, full_plan
from server.dashboard.planner import PRESETS, load_shape

SHAPE = PRESETS["qwen2.5-1.5b"]
LORA = 18_464_768
T = 4096  # tokens per micro-batch


def test_parameter_counts_by_hand() -> None:
    assert SHAPE.layer_parameters() == 46_797_824
    assert SHAPE.parameters() == 1_543_714_304
    plan = full_plan(
        SHAPE, 16, "all-linear", micro_batch_tokens=T, learner=None, workers=[], fleet=_fleet()
    )
    assert plan.memory["single"].lora_state == pytest.approx(16 * LORA / 1e9)


def test_memory_without_fsdp() -> None:
    # weights 2·P = 3,087,428,608 B; LoRA state 16·Lp = 295,436,288 B.
    # Activations per token and layer 2·(6·1536 + 2·256 + 4·8960) = 2·45,568 = 91,136 B;
    # all 28 layers: 2,551,808 B per token, × 4096 = 10,452,205,568 B.
    # Logits 4096 · 4 · 151,936 = 2,489,319,424 B. Total 16,324,389,888 B.
    m = learner_memory(SHAPE, LORA, T, gpus=4, fsdp=False, checkpointing=False)
    assert m.weights == pytest.approx(3.087428608)
    assert m.lora_state == pytest.approx(0.295436288)
    assert m.activations == pytest.approx(10.452205568)
    assert m.logits == pytest.approx(2.489319424)
    assert m.total == pytest.approx(16.324389888)


def test_checkpointing_keeps_layer_inputs_and_one_layer() -> None:
    # 2·28·1536 = 86,016 B of layer inputs + 91,136 B of the recomputed layer = 177,152 B per
    # token, × 4096 = 725,614,592 B.
    m = learner_memory(SHAPE, LORA, T, gpus=1, fsdp=False, checkpointing=True)
    assert m.activations == pytest.approx(0.725614592)


def test_fsdp_shards_the_decoder_layers_only() -> None:
    # What the learner's FSDP2 shards (test_fleet_plan_fsdp.py checks it on real ranks): the 28
    # layers' bf16 weights 2·1,310,339,072 = 2,620,678,144 B / 4 = 655,169,536 B, plus two
    # unsharded layers in flight 2·2·46,797,824 = 187,191,296 B; the embeddings and final norm
    # stay whole: 2·(233,373,696 + 1,536) = 466,750,464 B. Weights 1,309,111,296 B. The LoRA
    # state stays whole (295,436,288 B), the activations are per GPU.
    m = learner_memory(SHAPE, LORA, T, gpus=4, fsdp=True, checkpointing=False)
    assert m.weights == pytest.approx(1.309111296)
    assert m.lora_state == pytest.approx(0.295436288)
    assert m.activations == pytest.approx(10.452205568)


def _fleet(worker_sequences: int = 32, accept: float = 0.8) -> FleetInputs:
    return FleetInputs(
        completion_tokens=512,
        group_size=8,
        bound_groups=16,
        worker_sequences=worker_sequences,
        accept_fraction=accept,
        learner_gpus=1,
    )


LEARNER = Gpu("H100", 2.5, 4800)
L4 = Gpu("L4", 0.35, 1500)


def test_workers_that_keep_the_learner_busy() -> None:
    # Learner: 4800 completion tokens/s ÷ 512 = 9.375 samples/s. One L4: 0.8 · 1500 / 512 =
    # 2.34375 accepted samples/s; needed 9.375 / 2.34375 = 4. Bound 16 groups · 8 = 128
    # sequences, 32 per worker: 4 usable. Accepted 9.375/s = 33,750/h; cost 4 · 0.35 + 2.5 =
    # 3.90 $/h: 3.9 / 33,750 · 1000 = 0.11556 $ per 1,000 accepted samples.
    row = fleet_row(L4, LEARNER, _fleet())
    assert (row.workers_needed, row.workers_usable, row.workers) == (4, 4, 4)
    assert not row.bound_limited
    assert row.learner_busy == pytest.approx(1.0)
    assert row.accepted_per_hour == pytest.approx(33_750)
    assert row.cost_per_hour == pytest.approx(3.9)
    assert row.cost_per_1000_accepted == pytest.approx(3.9 / 33_750 * 1000)


def test_workers_round_up() -> None:
    # 5000 / 512 = 9.765625 samples/s ÷ 2.34375 = 4.17: 5 workers; 16 sequences per worker:
    # 128 // 16 = 8 usable. Accepted 9.765625/s = 35,156.25/h; cost 5 · 0.35 + 2.5 = 4.25 $/h:
    # 4.25 / 35,156.25 · 1000 = 0.12089 $.
    row = fleet_row(L4, Gpu("H100", 2.5, 5000), _fleet(worker_sequences=16))
    assert (row.workers_needed, row.workers_usable, row.workers) == (5, 8, 5)
    assert row.cost_per_1000_accepted == pytest.approx(4.25 / 35_156.25 * 1000)


def test_admission_bound_caps_the_fleet() -> None:
    # 64 sequences per worker: 128 // 64 = 2 usable workers, 2 · 2.34375 = 4.6875 accepted/s
    # = 16,875/h, learner busy 4.6875 / 9.375 = 50%; cost 2 · 0.35 + 2.5 = 3.2 $/h:
    # 3.2 / 16,875 · 1000 = 0.18963 $.
    row = fleet_row(L4, LEARNER, _fleet(worker_sequences=64))
    assert (row.workers_needed, row.workers_usable, row.workers) == (4, 2, 2)
    assert row.bound_limited
    assert row.learner_busy == pytest.approx(0.5)
    assert row.accepted_per_hour == pytest.approx(16_875)
    assert row.cost_per_1000_accepted == pytest.approx(3.2 / 16_875 * 1000)


def test_shape_from_a_local_hf_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_shape(str(tmp_path)).parameters() == SHAPE.parameters()
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": "big"}))
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        load_shape(str(tmp_path / "config.json"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("L4", "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
        ("L4:0.3", "no tokens/s given and none measured for L4"),
        ("L4:cheap:100", "must be numbers"),
        ("L4:-1:100", "price must be between 0 and 10,000 USD per hour"),
        ("L4:1e308:100", "price must be between 0 and 10,000"),
        ("L4:nan:100", "price must be between 0 and 10,000"),
        ("L4:0.3:0", "tokens/s must be between 0.001 and 1,000,000,000"),
        ("L4:0.3:nan", "tokens/s must be between 0.001"),
        ("L4:0.3:inf", "tokens/s must be between 0.001"),
        ("L4:0.3:1e-320", "tokens/s must be between 0.001"),
        ("L4:0.3:1e308", "tokens/s must be between 0.001"),
        ("L4:0.3:1:2", "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
        (":0.3:1", "NAME:PRICE_PER_HOUR:TOKENS_PER_S"),
    ],
)
def test_bad_gpu_offers_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Gpu.parse(text)


def test_an_offer_without_tokens_takes_the_measured_rate() -> None:
    assert Gpu.parse("l4:0.3", {"L4": 50.0}) == Gpu("l4", 0.3, 50.0)
    assert Gpu.parse("L4:0.3:70", {"L4": 50.0}).tokens_per_s == 70  # written wins


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("completion_tokens", 0.5),
        ("completion_tokens", float("nan")),
        ("completion_tokens", float("inf")),
        ("completion_tokens", 1e308),
        ("group_size", 0),
        ("group_size", 10**40),
        ("bound_groups", -1),
        ("worker_sequences", 10**400),
        ("learner_gpus", 0),
        ("learner_gpus", 5000),
        ("accept_fraction", 0.0),
        ("accept_fraction", 1e-320),
        ("accept_fraction", float("nan")),
        ("accept_fraction", 1.5),
    ],
)
def test_fleet_inputs_out_of_range_are_refused(field: str, value: float) -> None:
    """Hostile numbers get a message naming the field, never an OverflowError or a division by
    zero further on (huge ones used to overflow ceil() or the float conversion)."""
    from dataclasses import replace

    fleet = replace(_fleet(), **{field: value})
    with pytest.raises(ValueError, match=f"^{field} must be between"):
        full_plan(SHAPE, 16, "all-linear", micro_batch_tokens=T, learner=LEARNER, workers=[L4],
                  fleet=fleet)  # fmt: skip


@pytest.mark.parametrize("tokens", [0, -3, 10**400])
def test_micro_batch_tokens_out_of_range_are_refused(tokens: int) -> None:
    with pytest.raises(ValueError, match="^micro_batch_tokens must be between 1 and 100,000,000"):
        full_plan(SHAPE, 16, "all-linear", micro_batch_tokens=tokens, learner=None, workers=[],
                  fleet=_fleet())  # fmt: skip


def test_the_extremes_within_the_limits_stay_finite() -> None:
    """The slowest worker against the fastest learner at the largest sizes: finite numbers."""
    import math

    fleet = FleetInputs(
        completion_tokens=1_000_000,
        group_size=4096,
        bound_groups=10_000_000,
        worker_sequences=1,
        accept_fraction=0.001,
        learner_gpus=4096,
    )
    row = fleet_row(Gpu("W", 10_000, 0.001), Gpu("L", 10_000, 1e9), fleet)
    values = [row.workers_needed, row.accepted_per_hour, row.cost_per_1000_accepted]
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert row.workers_needed == 10**15 and row.bound_limited
    m = learner_memory(SHAPE, LORA, 100_000_000, gpus=4096, fsdp=True, checkpointing=False)
    assert math.isfinite(m.total)


def test_a_config_json_with_absurd_sizes_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    config = {
        "num_hidden_layers": 2,
        "hidden_size": 10**200,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 100,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_size must be a positive integer, at most 10,000"):
        load_shape(str(tmp_path))
    config["hidden_size"] = 4  # 4 heads of width 1 is a shape; 64 heads in 4 is not
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 64}))
    with pytest.raises(ValueError, match=r"num_attention_heads \(64\) must divide hidden_size"):
        load_shape(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    with pytest.raises(ValueError, match=r"num_key_value_heads \(3\) must divide"):
        load_shape(str(tmp_path))


def test_a_config_json_with_its_own_head_dim(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Qwen3-4B's config.json: head_dim 128 with 32 heads (q is 4096 wide, hidden 2560) and q/k
    norms. Per layer: q, o 2560·4096 = 10,485,760 each; k, v 2560·1024 = 2,621,440 each; MLP
    3·2560·9728 = 74,711,040; norms 2·2560 + 2·128: 100,930,816. 36 layers + embeddings
    151,936·2560 (tied) + final norm: 4,022,468,096 (the published 4.0B)."""
    import json

    config = {
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "attention_bias": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = load_shape(str(tmp_path))
    assert shape.q_dim == 4096 and shape.kv_dim == 1024
    assert shape.layer_parameters() == 100_930_816
    assert shape.parameters() == 4_022_468_096
