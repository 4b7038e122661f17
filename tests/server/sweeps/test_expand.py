"""A sweep's combinations without a database (server/sweeps/expand.py): paths checked against
the run config's fields (nested models, optional blocks, unions, list items, free dicts), the
grid's order, overrides applied to a copy, and run names within 200 characters."""

from __future__ import annotations

import pytest

from server.errors import Unprocessable
from server.sweeps import expand
from tests.server.runs.conftest import example_config


@pytest.mark.parametrize(
    "path",
    [
        "grpo.learning_rate",
        "lora.rank",
        "grpo.loss_type",
        "seed",
        "dataset.size",  # a field of one kind of the dataset union
        "dataset.rows",
        "eval.every_versions",  # inside an optional block
        "rewards.0.weight",  # a list item's field
        "rewards.0.kwargs.anything",  # a free dict
        "lora.target_modules",
    ],
)
def test_real_config_paths_are_known(path: str) -> None:
    assert expand.check_path(path, f"grid.{path}") == path.split(".")


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("optimizer.lr", "the run config has no 'optimizer'"),
        ("loss.loss_type", "the run config has no 'loss'"),
        ("grpo.lr", "grpo has no 'lr'"),
        ("grpo.learning_rat", "did you mean 'learning_rate'"),
        ("lora.rank.x", "lora.rank has no 'x'"),
        ("rewards.first.weight", "rewards has no 'first'"),
        ("grpo..beta", "grpo has no ''"),
        ("name", "cannot be swept"),
        ("rewards.0.kwargs" + ".a" * 40, "nests at most 32"),
    ],
)
def test_unknown_paths_are_named(path: str, words: str) -> None:
    with pytest.raises(Unprocessable) as caught:
        expand.check_path(path, f"grid.{path}")
    assert caught.value.code == "sweep_path_unknown"
    assert caught.value.extra["field"] == f"grid.{path}"
    assert words in caught.value.message


def test_the_grid_expands_with_its_last_path_fastest() -> None:
    combos = expand.combinations({"grpo.beta": [0.0, 0.1], "seed": [3, 4, 5]}, None, 64)
    assert combos == [{"grpo.beta": b, "seed": s} for b in (0.0, 0.1) for s in (3, 4, 5)]
    with pytest.raises(Unprocessable) as caught:
        expand.combinations({"grpo.beta": [0.0, 0.1], "seed": [3, 4, 5]}, None, 5)
    assert caught.value.code == "sweep_too_large" and "6 runs" in caught.value.message


def test_overrides_apply_to_a_copy_and_make_missing_blocks() -> None:
    base = example_config()
    base.pop("lora")
    config = expand.applied(base, {"lora.rank": 8, "rewards.0.weight": 2.0, "grpo.beta": 0.1})
    assert config["lora"] == {"rank": 8}
    assert config["rewards"][0]["weight"] == 2.0 and base["rewards"][0]["weight"] == 1.0
    assert config["grpo"]["beta"] == 0.1 and base["grpo"]["beta"] == 0.0
    with pytest.raises(IndexError):
        expand.applied(base, {"rewards.3.weight": 2.0})


def test_run_names_say_the_overrides_within_200_characters() -> None:
    assert expand.run_name("s", {"grpo.learning_rate": 1e-5, "grpo.loss_type": "cispo"}) == (
        "s grpo.learning_rate=1e-05 grpo.loss_type=cispo"
    )
    assert expand.run_name("s", {}) == "s (base)"
    long = expand.run_name("x" * 160, {f"rewards.0.kwargs.k{i}": "v" * 50 for i in range(4)})
    assert len(long) == 200 and long.endswith("…")
    # a validated combination keeps its name
    configs = expand.validated("s", example_config(), [{"lora.rank": 8}], "grid")
    assert configs[0].name == "s lora.rank=8" and configs[0].lora.rank == 8
