"""bench/learning.py's task configs and eval figures (the run itself is a benchmark, not CI)."""

from __future__ import annotations

from bench.learning import (
    EVAL_PROMPTS,
    TASKS,
    eval_figures,
    goals_met,
    held_out_additions,
    word_problems_config,
)
from protocol import datasets
from protocol.run_config import RunConfig


def test_every_task_config_validates_and_evaluates_version_0_and_the_last() -> None:
    for name, (make, versions) in TASKS.items():
        config = RunConfig.model_validate(make(versions, 3))
        assert config.eval is not None, name
        assert config.max_versions == versions
        assert versions % config.eval.every_versions == 0  # the last version is due anyway
        assert config.eval.temperature == 0.0 and config.eval.n == 1


def test_arithmetic_eval_prompts_are_held_out() -> None:
    rows = held_out_additions(5)
    assert len(rows) == EVAL_PROMPTS
    train = {r["prompt"] for r in datasets.generate("arithmetic", 1000, 5)}
    assert not train & {r["prompt"] for r in rows}


def test_word_problems_reads_the_example_with_absolute_data_files() -> None:
    config = word_problems_config(4, 0)
    for ds in (config["dataset"], config["eval"]["dataset"]):
        assert ds["data_files"].startswith("/") and ds["data_files"].endswith(".jsonl")


def test_eval_figures_compare_version_0_with_the_last_done_version() -> None:
    evals = [
        {"version": 0, "state": "done", "accuracy": 0.25},
        {"version": 8, "state": "done", "accuracy": 0.5},
        {"version": 16, "state": "done", "accuracy": 0.625},
        {"version": 20, "state": "pending", "accuracy": None},
    ]
    run = {"best_version": 16, "best_metric": "eval_accuracy", "status_reason": "final"}
    figures = eval_figures(evals, run)
    assert figures["eval_accuracy_v0"] == 0.25
    assert figures["eval_last_version"] == 16
    assert figures["eval_gain"] == 0.375
    assert (figures["best_version"], figures["eval_accuracy_best"]) == (16, 0.625)
    assert figures["best_gain"] == 0.375 and not figures["stopped_early"]
    assert eval_figures(evals[:1], {})["eval_gain"] is None
    assert eval_figures([], {})["eval_accuracy_v0"] is None


def _figures(best: float, last: float, stopped_early: bool = False) -> dict[str, object]:
    evals = [
        {"version": 0, "state": "done", "accuracy": 0.05},
        {"version": 8, "state": "done", "accuracy": best},
        {"version": 16, "state": "done", "accuracy": last},
    ]
    reason = "early stop: patience" if stopped_early else "final version published"
    return eval_figures(evals, {"best_version": 8, "status_reason": reason})


def test_the_goals_are_the_best_versions_gain_and_a_final_close_to_it() -> None:
    assert goals_met(_figures(0.6, 0.55))[0]
    assert not goals_met(_figures(0.3, 0.3))[0]  # the best gains 0.25 < 0.3
    assert not goals_met(_figures(0.6, 0.2))[0]  # the last lost 0.4 to the best
    assert goals_met(_figures(0.6, 0.2, stopped_early=True))[0]
    assert not goals_met(eval_figures([], {}))[0]
