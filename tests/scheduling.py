"""The order pytest-xdist hands files to its workers (docs/guides/developing.md, "Parallel
workers"): the test command runs `-n 4 --dist loadfile --no-loadscope-reorder`, which gives each
free worker the next whole file in collection order. Collecting the longest files first makes
that a longest-first schedule, so a 5-minute file never starts last while three workers idle.

A pytest plugin (tests/conftest.py lists it in `pytest_plugins`). It reorders only in an xdist
worker, where the order is the schedule; a serial run keeps the order of the files on disk.
The order never changes what a test checks: only when it starts."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

# Wall seconds of the slowest files under `-n 4` on 2 cores (setup + call + teardown of all
# their tests, from `--durations=0`). A hint for the order only: stale figures cost minutes,
# never a result. Files not listed are estimated from their layers (LAYER_SECONDS).
FILE_SECONDS: dict[str, float] = {  # 2026-12-07, 2 cores, -n 4; every file of 10 s or more
    "tests/worker/test_vllm_backend.py": 463,
    "tests/e2e/test_faults.py": 437,
    "tests/learner/test_data_parallel_kill.py": 409,
    "tests/e2e/test_demo.py": 260,
    "tests/learner/test_overlap.py": 231,
    "tests/worker/test_e2e.py": 176,
    "tests/learner/test_e2e_learner.py": 141,
    "tests/worker/test_transformers_concurrency.py": 141,
    "tests/worker/test_vllm_concurrency.py": 119,
    "tests/fuzz/test_fuzz_api.py": 115,
    "tests/worker/test_concurrency.py": 100,
    "tests/bench/test_pipeline.py": 100,
    "tests/e2e/test_local.py": 87,
    "tests/learner/test_bucket_outage.py": 68,
    "tests/learner/test_data_parallel.py": 68,
    "tests/bench/test_gpu_check.py": 66,
    "tests/learner/test_direction.py": 64,
    "tests/bench/test_learner_ranks.py": 58,
    "tests/learner/test_bucketing.py": 57,
    "tests/server/datasets/test_upload.py": 56,
    "tests/learner/test_trajectory_logprobs.py": 50,
    "tests/e2e/test_first_gpu_run_tutorial.py": 47,  # alone (2026-12-07), not yet from a -n 4 run
    "tests/learner/test_pool_learner_many.py": 172,  # alone, beside a -n 4 run (2026-12-07)
    "tests/learner/test_shared_base.py": 94,  # alone, beside a -n 4 run (2026-12-07)
    "tests/server/test_bucket_readiness.py": 39,
    "tests/server/learner/test_trajectory_sample_hostile.py": 36,
    "tests/worker/environments/test_backend_engine.py": 35,
    "tests/browser/test_dashboard.py": 35,
    "tests/asyncgrpo/test_cli_tokens.py": 33,
    "tests/server/learner/test_trajectory_sample_memory.py": 33,
    "tests/server/datasets/test_parquet_memory.py": 31,
    "tests/learner/test_rank_env_errors.py": 29,
    "tests/server/leases/test_no_deadlock.py": 29,
    "tests/worker/test_multi_turn_e2e.py": 29,
    "tests/server/runs/test_create.py": 28,
    "tests/server/jobs/test_celery.py": 28,
    "tests/e2e/test_eval_e2e.py": 26,
    "tests/server/dashboard/test_fleet_plan_fsdp.py": 26,
    "tests/server/learner/test_free_json_edges.py": 26,
    "tests/asyncgrpo/doctor/test_cli.py": 26,
    "tests/learner/test_lost_publish_answer.py": 25,
    "tests/learner/tracking/test_learner_tracking.py": 25,
    "tests/worker/test_transformers_backend.py": 22,
    "tests/learner/test_e2e_learner_trajectories.py": 22,
    "tests/server/leases/test_server_resources.py": 22,
    "tests/worker/test_signals.py": 22,
    "tests/server/dashboard/test_pages.py": 21,
    "tests/learner/test_refusals.py": 21,
    "tests/learner/tracking/test_backends.py": 20,
    "tests/server/leases/test_refusals.py": 20,
    "tests/server/dashboard/test_trajectory_view.py": 18,
    "tests/server/datasets/test_runs_on_datasets.py": 18,
    "tests/server/runs/test_webhook_url.py": 17,
    "tests/server/leases/test_concurrency.py": 17,
    "tests/server/evals/test_eval_leases.py": 17,
    "tests/server/versions/test_versions.py": 17,
    "tests/deploy/test_skypilot.py": 16,
    "tests/learner/test_reward_pool.py": 16,
    "tests/server/dashboard/test_form_edges.py": 15,
    "tests/server/leases/test_wakeups.py": 15,
    "tests/server/test_error_codes.py": 15,
    "tests/server/runs/test_names_and_kwargs_api.py": 14,
    "tests/learner/test_intake_rewards.py": 14,
    "tests/server/datasets/test_run_preparation.py": 14,
    "tests/packaging/test_wheel.py": 14,
    "tests/server/blobs/test_blobs.py": 13,
    "tests/server/doctor/test_routes.py": 13,
    "tests/e2e/test_server_processes.py": 13,
    "tests/worker/test_worker_state.py": 12,
    "tests/server/test_installation.py": 12,
    "tests/server/leases/test_fenced.py": 12,
    "tests/learner/test_transfers.py": 12,
    "tests/worker/environments/test_verifiers_env.py": 11,
    "tests/server/learner/test_attach_codes.py": 11,
    "tests/server/learner/test_claim_target.py": 11,
    "tests/server/datasets/test_eval_datasets.py": 11,
    "tests/server/tokens/test_tokens.py": 11,
    "tests/server/dashboard/test_run_page_and_headers.py": 11,
    "tests/server/jobs/test_webhook_isolation.py": 11,
    "tests/server/tokens/test_revocation.py": 11,
    "tests/server/runs/test_reward_builtins.py": 11,
    "tests/server/runs/test_config_cache.py": 10,
}

# A test's expected seconds by its layer (tests/layers.py adds the marker before this runs).
LAYER_SECONDS = {"e2e": 10.0, "integration": 0.2, "unit": 0.02}


def _item_seconds(item: pytest.Item) -> float:
    for layer in ("e2e", "integration", "unit"):
        if item.get_closest_marker(layer) is not None:
            return LAYER_SECONDS[layer]
    return LAYER_SECONDS["unit"]


def file_seconds(items: list[pytest.Item]) -> dict[str, float]:
    """Expected seconds per file: the measured figure where there is one, else by layers."""
    estimated: dict[str, float] = defaultdict(float)
    for item in items:
        estimated[item.location[0]] += _item_seconds(item)
    return {path: FILE_SECONDS.get(path, guess) for path, guess in estimated.items()}


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items regrouped by file, longest file first; ties and each file's own tests keep
    their collection order (the sort is stable), so every worker collects the same order."""
    seconds = file_seconds(items)
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.location[0], index)
    return sorted(
        items, key=lambda item: (-seconds[item.location[0]], first_seen[item.location[0]])
    )


@pytest.hookimpl(trylast=True)  # after tests/layers.py has marked every item
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = longest_files_first(items)
