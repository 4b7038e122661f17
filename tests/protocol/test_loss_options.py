"""Every combination of loss_type × importance_level × correction × beta (the table in
docs/guides/run-config.md, "The GRPO loss"): valid, or refused at the field with the reason."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from protocol.run_config import RunConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "runs" / "arithmetic.json"

SEQ_CISPO = (
    "grpo.importance_level",
    ["importance_level 'sequence'", "loss_type 'cispo'", "GSPO", "clipped surrogate"],
)
SEQ_TIS = (
    "grpo.importance_level",
    ["importance_level 'sequence'", "correction 'tis'", "per-token truncated weight"],
)
CISPO_TIS = (
    "grpo.correction",
    ["correction 'tis'", "loss_type 'cispo'", "epsilon_high", "= C − 1"],
)

# (loss_type, importance_level, correction) → the refusals expected; beta never matters.
TABLE: dict[tuple[str, str, str], list[tuple[str, list[str]]]] = {
    ("grpo", "token", "none"): [],
    ("grpo", "token", "tis"): [],
    ("grpo", "sequence", "none"): [],
    ("grpo", "sequence", "tis"): [SEQ_TIS],
    ("dapo", "token", "none"): [],
    ("dapo", "token", "tis"): [],
    ("dapo", "sequence", "none"): [],
    ("dapo", "sequence", "tis"): [SEQ_TIS],
    ("dr_grpo", "token", "none"): [],
    ("dr_grpo", "token", "tis"): [],
    ("dr_grpo", "sequence", "none"): [],
    ("dr_grpo", "sequence", "tis"): [SEQ_TIS],
    ("cispo", "token", "none"): [],
    ("cispo", "token", "tis"): [CISPO_TIS],
    ("cispo", "sequence", "none"): [SEQ_CISPO],
    ("cispo", "sequence", "tis"): [CISPO_TIS, SEQ_CISPO, SEQ_TIS],
}


def base() -> dict[str, Any]:
    return json.loads(EXAMPLE.read_text())


def _config(**grpo: Any) -> dict[str, Any]:
    cfg = base()
    cfg["grpo"].update(grpo)
    return cfg


def _errors(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(cfg)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in info.value.errors()]


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize(("loss_type", "level", "correction"), list(TABLE))
def test_every_combination(loss_type: str, level: str, correction: str, beta: float) -> None:
    cfg = _config(loss_type=loss_type, importance_level=level, correction=correction, beta=beta)
    expected = TABLE[(loss_type, level, correction)]
    if not expected:
        grpo = RunConfig.model_validate(cfg).grpo
        assert (grpo.loss_type, grpo.importance_level, grpo.correction) == (
            loss_type,
            level,
            correction,
        )
        return
    errors = _errors(cfg)
    assert len(errors) == len(expected), errors
    for (field, message), (want_field, needles) in zip(errors, expected, strict=True):
        assert field == want_field
        for needle in needles:
            assert needle in message, (needle, message)


@pytest.mark.parametrize("epsilon_low", [1.0, 1.5, 100.0])
def test_epsilon_low_of_one_or_more_only_for_cispo(epsilon_low: float) -> None:
    cispo = RunConfig.model_validate(_config(loss_type="cispo", epsilon_low=epsilon_low))
    assert cispo.grpo.epsilon_low == epsilon_low
    for loss_type, level in itertools.product(("grpo", "dapo", "dr_grpo"), ("token", "sequence")):
        errors = _errors(
            _config(loss_type=loss_type, importance_level=level, epsilon_low=epsilon_low)
        )
        assert len(errors) == 1, errors
        field, message = errors[0]
        assert field == "grpo.epsilon_low"
        assert f"epsilon_low must be in [0, 1) with loss_type '{loss_type}'" in message
        assert "never clips from below" in message
        assert "only loss_type 'cispo'" in message
        assert repr(epsilon_low) in message


def test_gspo_epsilons_accepted() -> None:
    cfg = _config(
        loss_type="grpo", importance_level="sequence", epsilon_low=3e-4, epsilon_high=4e-4
    )
    grpo = RunConfig.model_validate(cfg).grpo
    assert (grpo.epsilon_low, grpo.epsilon_high) == (3e-4, 4e-4)


def test_default_importance_level_is_token() -> None:
    cfg = base()
    del cfg["grpo"]["importance_level"]
    assert RunConfig.model_validate(cfg).grpo.importance_level == "token"
