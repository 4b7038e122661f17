"""The one bound on free-form JSON fields (protocol.schemas.check_free_json)."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.schemas import MAX_JSON_DEPTH, check_free_json


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


def test_depth_up_to_the_limit_passes_and_beyond_names_the_path() -> None:
    ok = nested(MAX_JSON_DEPTH)
    assert check_free_json(ok, 1 << 20) is ok
    with pytest.raises(ValueError, match=r"nested deeper than 32 levels \(at k\.k"):
        check_free_json(nested(MAX_JSON_DEPTH + 1), 1 << 20)


def test_a_hostile_depth_is_refused_without_recursion() -> None:
    deep: Any = 0
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        check_free_json(deep, 1 << 30)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_numbers_must_be_finite(bad: float) -> None:
    with pytest.raises(ValueError, match=r"finite.*\(at a\[1\]\)"):
        check_free_json({"a": [1.5, bad]}, 1 << 20)


def test_nul_in_values_and_keys_is_refused() -> None:
    with pytest.raises(ValueError, match=r"NUL.*\(at a\)"):
        check_free_json({"a": "x\x00y"}, 1 << 20)
    with pytest.raises(ValueError, match="NUL"):
        check_free_json({"k\x00": 1}, 1 << 20)


def test_unpaired_surrogates_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unpaired surrogate.*\(at a\[0\]\)"):
        check_free_json({"a": ["x\ud800"]}, 1 << 20)
    with pytest.raises(ValueError, match="unpaired surrogate"):
        check_free_json({"k\udfff": 1}, 1 << 20)
    assert check_free_json({"a": "😀 paired"}, 1 << 20)


def test_size_is_bounded() -> None:
    assert check_free_json({"s": "x" * 900}, 1000)
    with pytest.raises(ValueError, match="larger than 1,000 bytes"):
        check_free_json({"s": "x" * 1000}, 1000)
    with pytest.raises(ValueError, match="larger than"):
        check_free_json([0] * 1000, 1000)
