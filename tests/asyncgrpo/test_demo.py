"""The demo's run config (asyncgrpo/demo.py): the bundled arithmetic run, sized to end after the
versions asked for."""

from __future__ import annotations

from asyncgrpo.demo import demo_config
from protocol.run_config import RunConfig


def test_demo_config_is_the_learning_setup_and_valid() -> None:
    config = demo_config(12, seed=3)
    run = RunConfig.model_validate(config)
    assert run.group_size * run.prompts_per_step >= 64  # samples per version
    assert run.max_versions == 12 and config["dataset"]["seed"] == 3 and run.seed == 3
    assert config["dataset"]["size"] == 12 * run.prompts_per_step
    assert run.rewards[0].name == "numeric_match"
