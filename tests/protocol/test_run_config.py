"""Run config validation: one case per rule, each checking the field path and the message."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from protocol.run_config import RunConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "runs" / "arithmetic.json"


def base() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def with_patch(path: str, value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base())
    *parents, last = path.split(".")
    node: Any = cfg
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return cfg


def errors_of(cfg: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(cfg)
    return [(".".join(str(p) for p in e["loc"]), e["msg"], e["type"]) for e in info.value.errors()]


def test_example_config_is_valid_and_round_trips() -> None:
    cfg = RunConfig.model_validate(base())
    assert cfg.model_dump(mode="json") == base()
    assert cfg.admission_bound_groups() == (1 + 1) * 1 * 8


# (path to set, value, field path of the error, part of the message)
RULES = [
    ("group_size", 1, "group_size", "group_size must be at least 2"),
    ("prompts_per_lease", 0, "prompts_per_lease", "prompts_per_lease must be at least 1"),
    ("prompts_per_step", 0, "prompts_per_step", "prompts_per_step must be at least 1"),
    (
        "prompts_per_step",
        7,
        "prompts_per_step",
        "prompts_per_step must be a multiple of prompts_per_lease (2)",
    ),
    ("weight_sync_steps", 0, "weight_sync_steps", "weight_sync_steps must be at least 1"),
    ("max_staleness", -1, "max_staleness", "max_staleness must be at least 0"),
    ("max_attempts", 0, "max_attempts", "max_attempts must be at least 1"),
    ("epochs", 0, "epochs", "epochs must be at least 1"),
    ("epochs", 100_000, "epochs", "epochs × dataset rows must be at most 5,000,000"),
    (
        "max_versions",
        0,
        "max_versions",
        "max_versions must be between 1 and 2,147,483,647 when set",
    ),
    ("sampling.temperature", 0.0, "sampling.temperature", "temperature must be greater than 0"),
    ("sampling.top_p", 0.95, "sampling.top_p", "top_p must be 1.0"),
    ("sampling.top_k", 50, "sampling.top_k", "top_k must be 0 or -1"),
    (
        "sampling.repetition_penalty",
        1.1,
        "sampling.repetition_penalty",
        "repetition_penalty must be 1.0 (no penalties",
    ),
    (
        "sampling.presence_penalty",
        0.5,
        "sampling.presence_penalty",
        "presence_penalty must be 0.0 (no penalties",
    ),
    (
        "sampling.frequency_penalty",
        0.5,
        "sampling.frequency_penalty",
        "frequency_penalty must be 0.0 (no penalties",
    ),
    (
        "sampling.max_new_tokens",
        0,
        "sampling.max_new_tokens",
        "max_new_tokens must be between 1 and 8192",
    ),
    (
        "sampling.max_new_tokens",
        8193,
        "sampling.max_new_tokens",
        "max_new_tokens must be between 1 and 8192",
    ),
    ("lora.rank", 0, "lora.rank", "rank must be between 1 and 1024"),
    ("lora.alpha", 0.0, "lora.alpha", "alpha must be greater than 0"),
    ("lora.dropout", 1.0, "lora.dropout", "dropout must be in [0, 1)"),
    ("lora.dropout", -0.1, "lora.dropout", "dropout must be in [0, 1)"),
    ("lora.target_modules", [], "lora.target_modules", "target_modules must name at least one"),
    ("lora.target_modules", ["q_proj", " "], "lora.target_modules", "no empty names"),
    ("grpo.learning_rate", 0.0, "grpo.learning_rate", "learning_rate must be greater than 0"),
    ("grpo.epsilon_low", 1.0, "grpo.epsilon_low", "epsilon_low must be in [0, 1)"),
    ("grpo.epsilon_low", -0.1, "grpo.epsilon_low", "epsilon_low must be at least 0"),
    ("grpo.epsilon_high", -0.1, "grpo.epsilon_high", "epsilon_high must be at least 0"),
    ("grpo.beta", -0.01, "grpo.beta", "beta must be at least 0"),
    ("grpo.tis_cap", 0.5, "grpo.tis_cap", "tis_cap must be at least 1"),
    (
        "grpo.spot_check_fraction",
        1.5,
        "grpo.spot_check_fraction",
        "spot_check_fraction must be in [0, 1]",
    ),
    ("grpo.max_grad_norm", 0.0, "grpo.max_grad_norm", "max_grad_norm must be greater than 0"),
    ("grpo.weight_decay", -1.0, "grpo.weight_decay", "weight_decay must be at least 0"),
    ("grpo.warmup_steps", -1, "grpo.warmup_steps", "warmup_steps must be between 0 and"),
    ("grpo.lr_decay_steps", 0, "grpo.lr_decay_steps", "lr_decay_steps must be between 1 and"),
    ("grpo.min_lr_ratio", 1.5, "grpo.min_lr_ratio", "min_lr_ratio must be in [0, 1]"),
    (
        "grpo.lr_schedule",
        "step",
        "grpo.lr_schedule",
        "Input should be 'constant', 'linear' or 'cosine'",
    ),
    (
        "grpo.micro_batch_tokens",
        0,
        "grpo.micro_batch_tokens",
        "micro_batch_tokens must be at least 1",
    ),
    ("grpo.scale_rewards", "batch", "grpo.scale_rewards", "Input should be 'group' or 'none'"),
    (
        "grpo.loss_type",
        "ppo",
        "grpo.loss_type",
        "Input should be 'dapo', 'grpo', 'dr_grpo' or 'cispo'",
    ),
    ("grpo.importance_level", "seq", "grpo.importance_level", "'token' or 'sequence'"),
    ("grpo.correction", "is", "grpo.correction", "Input should be 'none' or 'tis'"),
    ("budget_usd", 0.0, "budget_usd", "budget_usd must be greater than 0 when set"),
    (
        "learner_price_per_hour",
        -1.0,
        "learner_price_per_hour",
        "learner_price_per_hour must be between 0 and 10,000",
    ),
    ("lease_ttl_s", 0.0, "lease_ttl_s", "lease_ttl_s must be greater than 0"),
    (
        "heartbeat_interval_s",
        0.0,
        "heartbeat_interval_s",
        "heartbeat_interval_s must be greater than 0",
    ),
    (
        "heartbeat_interval_s",
        120.0,
        "heartbeat_interval_s",
        "heartbeat_interval_s must be less than lease_ttl_s (120.0)",
    ),
    ("rewards", [], "rewards", "rewards must list at least one reward"),
    ("rewards.0.name", "numeric_mach", "rewards.0.name", "did you mean 'numeric_match'"),
    ("rewards.0.name", "os:system", "rewards.0.name", "part of Python's standard library"),
    ("rewards.0.name", "my module:fn", "rewards.0.name", "'module:function'"),
    ("rewards.0.name", "pkg.mod:", "rewards.0.name", "'module:function'"),
    (
        "rewards.0.kwargs",
        {"max_chars": 3},
        "rewards.0.kwargs",
        "numeric_match takes no argument max_chars",
    ),
    (
        "dataset.generator",
        "geometry",
        "dataset.generator.generator",
        "generator must be a built-in generator (arithmetic",
    ),
    ("dataset.size", 0, "dataset.generator.size", "size must be between 1 and 1,000,000"),
    ("dataset.size", 1_000_001, "dataset.generator.size", "size must be between 1 and 1,000,000"),
    (
        "dataset",
        {"kind": "jsonl", "rows": []},
        "dataset.jsonl.rows",
        "rows must hold between 1 and 1,000 rows (got 0)",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"answer": "1"}]},
        "dataset.jsonl.rows.0",
        "row has no `prompt` column",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"prompt": "  "}]},
        "dataset.jsonl.rows.0",
        "prompt must be a non-empty string",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"prompt": "ok"}, {"prompt": 3}]},
        "dataset.jsonl.rows.1",
        "prompt must be a non-empty string or a non-empty list",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"prompt": [{"role": "tool", "content": "x"}]}]},
        "dataset.jsonl.rows.0",
        "prompt message 0 has role 'tool'",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"prompt": [{"role": "user"}]}]},
        "dataset.jsonl.rows.0",
        "prompt message 0 must be an object with exactly role and content",
    ),
    (
        "dataset",
        {"kind": "jsonl", "rows": [{"prompt": [{"role": "user", "content": 5}]}]},
        "dataset.jsonl.rows.0",
        "prompt message 0 content must be a string",
    ),
    ("alarms.stale_waste", 0.0, "alarms.stale_waste", "stale_waste must be a fraction in (0, 1]"),
    (
        "alarms.clip_fraction",
        1.5,
        "alarms.clip_fraction",
        "clip_fraction must be a fraction in (0, 1]",
    ),
    (
        "alarms.no_version_minutes",
        0.0,
        "alarms.no_version_minutes",
        "no_version_minutes must be greater than 0",
    ),
    (
        "alarms.spot_check_mismatch",
        0.0,
        "alarms.spot_check_mismatch",
        "spot_check_mismatch must be greater than 0",
    ),
    ("alarms.window_minutes", 0.0, "alarms.window_minutes", "window_minutes must be in (0, 1440]"),
    (
        "alarms.webhook_url",
        "ftp://hooks.example/x",
        "alarms.webhook_url",
        "webhook_url must be an http:// or https:// URL",
    ),
    ("alarms.webhook_url", "https://", "alarms.webhook_url", "with a host"),
    ("alarms.entropy_floor", 0.0, "alarms.entropy_floor", "entropy_floor must be in (0, 100]"),
    ("alarms.entropy_drop", 1.0, "alarms.entropy_drop", "entropy_drop must be a fraction in (0, 1"),
    ("alarms.zero_advantage", 1.5, "alarms.zero_advantage", "must be a fraction in (0, 1]"),
    (
        "alarms.zero_advantage_versions",
        0,
        "alarms.zero_advantage_versions",
        "zero_advantage_versions must be between 1 and 1000",
    ),
    ("name", "", "name", "name must be 1 to 200 characters"),
    ("base_model", " ", "base_model", "base_model must be 1 to 500 characters"),
    ("grpo.learning_rate", float("inf"), "grpo.learning_rate", "finite number"),
]


@pytest.mark.parametrize(
    ("path", "value", "field", "message"), RULES, ids=[f"{r[0]}={r[1]!r}"[:60] for r in RULES]
)
def test_rule(path: str, value: Any, field: str, message: str) -> None:
    errors = errors_of(with_patch(path, value))
    assert len(errors) == 1, errors
    got_field, got_message, _type = errors[0]
    assert got_field == field
    assert message in got_message
    if _type == "config_rule" and not isinstance(value, list | dict):
        assert repr(value) in got_message  # the message shows the value received


@pytest.mark.parametrize("path", ["", "lora", "grpo", "sampling", "alarms", "dataset", "rewards.0"])
def test_unknown_fields_refused_at_every_level(path: str) -> None:
    cfg = base()
    node: Any = cfg
    for p in path.split(".") if path else []:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node["surprise"] = 1
    (error,) = errors_of(cfg)
    assert error[0].endswith("surprise")
    assert error[2] == "extra_forbidden"


def test_user_reward_syntax_is_checked_without_importing() -> None:
    cfg = with_patch("rewards.0.name", "no_such_package_xyz.rewards:score")
    parsed = RunConfig.model_validate(cfg)  # the module does not exist here: not imported
    assert parsed.rewards[0].name == "no_such_package_xyz.rewards:score"


def test_scale_rewards_none_and_group_both_accepted_with_dr_grpo() -> None:
    for scale in ("none", "group"):
        cfg = with_patch("grpo", {**base()["grpo"], "loss_type": "dr_grpo", "scale_rewards": scale})
        assert RunConfig.model_validate(cfg).grpo.scale_rewards == scale


def test_defaults_checked_against_given_values() -> None:
    # prompts_per_step keeps its default (8); a lease of 3 does not divide it.
    cfg = base()
    del cfg["prompts_per_step"]
    cfg["prompts_per_lease"] = 3
    (error,) = errors_of(cfg)
    assert error[0] == "prompts_per_step"
    assert "multiple of prompts_per_lease (3)" in error[1]


def test_jsonl_row_limit() -> None:
    rows = [{"prompt": "p"}] * 1_001
    (error,) = errors_of(with_patch("dataset", {"kind": "jsonl", "rows": rows}))
    assert error[0] == "dataset.jsonl.rows"
    assert "between 1 and 1,000 rows (got 1,001); use an uploaded dataset" in error[1]


def test_jsonl_size_limit() -> None:
    rows = [{"prompt": "p" * 2_000}] * 600
    (error,) = errors_of(with_patch("dataset", {"kind": "jsonl", "rows": rows}))
    assert error[0] == "dataset.jsonl.rows"
    assert "at most 1,048,576 bytes as JSON" in error[1] and "uploaded dataset" in error[1]


@pytest.mark.parametrize(
    ("dataset", "field", "message"),
    [
        ({"kind": "uploaded"}, "dataset.uploaded.id", "Field required"),
        ({"kind": "uploaded", "id": "x"}, "dataset.uploaded.id", "valid UUID"),
        ({"kind": "hf", "path": ""}, "dataset.hf.path", "path must be 1 to 500 characters"),
        ({"kind": "hf", "path": "a", "prompt_column": ""}, "dataset.hf.prompt_column", "column"),
        ({"kind": "hf", "path": "a", "extra": 1}, "dataset.hf.extra", "Extra inputs"),
        ({"kind": "rows_omitted", "rows": 3}, "dataset", "does not match any of the expected"),
        # URLs and fsspec chains would be fetched by the `datasets` library, past the outbound
        # policy (a loopback URL was fetched): only Hub ids, loader names and server paths
        (
            {"kind": "hf", "path": "json", "data_files": "http://127.0.0.1:9/x.jsonl"},
            "dataset.hf.data_files",
            "not a URL",
        ),
        (
            {"kind": "hf", "path": "json", "data_files": ["/d/a.jsonl", "s3://b/k.jsonl"]},
            "dataset.hf.data_files",
            "'s3://b/k.jsonl'",
        ),
        (
            {"kind": "hf", "path": "csv", "data_files": "zip://x.csv::/d/a.zip"},
            "dataset.hf.data_files",
            "past the outbound policy",
        ),
        ({"kind": "hf", "path": "https://169.254.169.254/latest"}, "dataset.hf.path", "not a URL"),
    ],
)
def test_stored_dataset_rules(dataset: dict[str, Any], field: str, message: str) -> None:
    (error,) = errors_of(with_patch("dataset", dataset))
    assert error[0] == field
    assert message in error[1]


def test_the_learner_view_has_no_inline_rows() -> None:
    from protocol.run_config import LearnerRunConfig, RunConfig

    config = RunConfig.model_validate(
        with_patch("dataset", {"kind": "jsonl", "rows": [{"prompt": "p", "answer": "1"}] * 3})
    )
    view = config.for_learner()
    assert view["dataset"] == {"kind": "rows_omitted", "rows": 3}
    parsed = LearnerRunConfig.model_validate(view)
    assert parsed.group_size == config.group_size and parsed.rewards == config.rewards
    hf = RunConfig.model_validate(with_patch("dataset", {"kind": "hf", "path": "openai/gsm8k"}))
    assert hf.for_learner()["dataset"] == hf.model_dump(mode="json")["dataset"]


def test_chat_prompts_and_reference_columns_accepted() -> None:
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
            ],
            "answer": "4",
            "source": "hand",
        },
        {"prompt": "3+3?", "answer": "6"},
    ]
    cfg = RunConfig.model_validate(with_patch("dataset", {"kind": "jsonl", "rows": rows}))
    assert cfg.dataset.kind == "jsonl"
    assert cfg.dataset.rows == rows


def test_a_decaying_schedule_needs_an_end_after_the_warm_up() -> None:
    cfg = with_patch("grpo.lr_schedule", "cosine")
    cfg["max_versions"], cfg["grpo"]["lr_decay_steps"] = None, None
    [(field, message, _type)] = errors_of(cfg)
    assert field == "grpo.lr_decay_steps" and "set it, or set max_versions" in message
    cfg["max_versions"], cfg["weight_sync_steps"], cfg["grpo"]["warmup_steps"] = 3, 2, 6
    [(field, message, _type)] = errors_of(cfg)
    assert field == "grpo.lr_decay_steps"
    assert "its end (6, from max_versions × weight_sync_steps)" in message
    assert "greater than warmup_steps (6)" in message
    cfg["grpo"]["lr_decay_steps"] = 7
    assert RunConfig.model_validate(cfg).lr_decay_end == 7
    cfg["grpo"]["lr_decay_steps"] = None
    cfg["max_versions"] = 4
    assert RunConfig.model_validate(cfg).lr_decay_end == 8  # 4 versions × 2 steps each


def test_a_warm_up_alone_needs_no_end() -> None:
    cfg = with_patch("grpo.warmup_steps", 5)
    cfg["max_versions"] = None
    assert RunConfig.model_validate(cfg).grpo.warmup_steps == 5


def test_the_learner_view_omits_an_unused_schedule_and_keeps_a_used_one() -> None:
    from protocol.run_config import LearnerRunConfig

    unused = base()  # the example decays; here, every schedule field at its default
    unused["grpo"].update(lr_schedule="constant", warmup_steps=0, lr_decay_steps=None)
    unused["grpo"]["min_lr_ratio"] = 0.0
    plain = RunConfig.model_validate(unused).for_learner()["grpo"]
    assert not {"lr_schedule", "warmup_steps", "lr_decay_steps", "min_lr_ratio"} & set(plain)
    cfg = with_patch("grpo.lr_schedule", "linear")
    cfg["grpo"].update(warmup_steps=2, min_lr_ratio=0.1, lr_decay_steps=None)
    cfg["max_versions"] = 10
    view = RunConfig.model_validate(cfg).for_learner()
    assert view["grpo"]["lr_schedule"] == "linear" and view["grpo"]["warmup_steps"] == 2
    parsed = LearnerRunConfig.model_validate(view)
    assert parsed.grpo.min_lr_ratio == 0.1 and parsed.lr_decay_end == 10
