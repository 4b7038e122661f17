"""Numbers a run config used to accept although nothing downstream could use them (issue 17)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from protocol.run_config import RunConfig


def _config(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "bounds",
        "base_model": "smollm2-135m-instruct",
        "dataset": {"kind": "generator", "size": 8},
        "rewards": [{"name": "numeric_match"}],
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"seed": 2**80}, "seed", "seed must be between 0 and 9,223,372,036,854,775,807"),
        ({"seed": -1}, "seed", "seed must be between 0"),
        ({"dataset": {"kind": "generator", "seed": 2**64}}, "dataset.generator.seed", "seed"),
        ({"lora": {"rank": 1e9}}, "lora.rank", "rank must be between 1 and 1024"),
        ({"max_versions": 10**30}, "max_versions", "max_versions must be between 1 and"),
        ({"max_versions": 2**31}, "max_versions", "2,147,483,647"),
        (
            {"learner_price_per_hour": 1e308},
            "learner_price_per_hour",
            "between 0 and 10,000 USD per hour",
        ),
    ],
)
def test_out_of_range_numbers_are_refused_with_the_field(
    overrides: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as info:
        RunConfig.model_validate(_config(**overrides))
    errors = info.value.errors()
    assert [".".join(map(str, e["loc"])) for e in errors] == [field]
    assert message in errors[0]["msg"]


def test_the_largest_allowed_values_pass() -> None:
    config = RunConfig.model_validate(
        _config(
            seed=2**63 - 1,
            lora={"rank": 1024},
            max_versions=2**31 - 1,
            learner_price_per_hour=10_000,
        )
    )
    assert config.seed == 2**63 - 1 and config.lora.rank == 1024
