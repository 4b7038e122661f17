"""Bad thresholds of the collapse alarms (alarms.entropy_floor, entropy_drop, zero_advantage,
zero_advantage_versions) are refused at run creation with the same 422 as the other alarm
fields, naming the field; on Postgres and SQLite."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.runs.conftest import example_config


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("entropy_floor", 0.0),
        ("entropy_floor", -1.0),
        ("entropy_drop", 1.0),
        ("entropy_drop", 0.0),
        ("zero_advantage", 0.0),
        ("zero_advantage", 1.01),
        ("zero_advantage_versions", 0),
        ("zero_advantage_versions", "three"),
    ],
)
def test_bad_thresholds_are_a_422_naming_the_field(
    runs_client: Any, admin: dict[str, str], field: str, value: Any
) -> None:
    config = example_config()
    config["alarms"] = {**config["alarms"], field: value}
    response = runs_client.post("/api/v1/runs", json=config, headers=admin)
    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == [f"alarms.{field}"], errors
    assert field in errors[0]["message"] or "integer" in errors[0]["message"], errors
