"""One pool learner holding several runs at once (docs/guides/pool-learners.md, "Many runs on
one learner"), against the real server with the real small model: three runs with their own
learning rates, ranks, target modules and loss (one `cispo`) trained side by side on one base
model, each to `completed` with its ledger balanced, and each run's recorded steps replayed
into a per-run learner give the adapter the pool published; a fourth run whose reward module
does not import fails alone. Killed with -9 inside a step (tests/learner/hold_pool_step.py), a
second pool learner takes the three runs and completes them from their last versions."""

from __future__ import annotations

import copy
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from learner.step_record import read_steps, replay
from lm.adapter_io import adapter_parameters, read_adapter_weights
from protocol.run_config import RunConfig
from server.db import transaction
from server.learner.ledger import ledger_model
from server.models import AdapterVersion, Run
from tests.conftest import mint_token
from tests.harness.batches import real_batch
from tests.harness.live_app import LiveApp, live_app, wait_log
from tests.harness.runs import plus_rows
from tests.server.learner.support import make_run, make_worker

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(600)]

STEPS = 3  # batches a run, each one step of its own version (weight_sync_steps 1)
BAD_MODULE = "asyncgrpo_tests_no_such_module"
RUNS: list[dict[str, Any]] = [
    {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
     "grpo": {"learning_rate": 1e-3, "spot_check_fraction": 0.0}},
    {"lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
     "grpo": {"learning_rate": 3e-3, "spot_check_fraction": 0.0}},
    {"lora": {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
     "grpo": {"learning_rate": 2e-3, "loss_type": "cispo", "spot_check_fraction": 0.0}},
]  # fmt: skip


@pytest.fixture
def pool_live(pg_url: str, tmp_path: Path) -> Iterator[LiveApp]:
    """The app with a 10 s learner lease: three runs' heartbeats share one busy process."""
    with live_app(pg_url, tmp_path, learner_lease_ttl_s=10.0, long_poll_s=1.0) as served:
        yield served


def _three_runs(app: Any, tok: Any, tmp_path: Path) -> list[uuid.UUID]:
    worker_id, _ = make_worker(app)
    runs = []
    for overrides in RUNS:
        run = make_run(
            app,
            dataset={"kind": "jsonl", "rows": plus_rows(2 * STEPS)},
            max_staleness=STEPS,  # every batch is of version 0
            sampling={"max_new_tokens": 8},
            **overrides,
        )
        for _ in range(STEPS):
            real_batch(app, run.id, worker_id, 0, tok, tmp_path)
        runs.append(run.id)
    return runs


def _statuses(app: Any, run_ids: list[uuid.UUID]) -> list[str]:
    with transaction(app.state.sessionmaker) as session:
        return [session.get(Run, r).status for r in run_ids]  # type: ignore[union-attr]


def _wait_statuses(
    app: Any, run_ids: list[uuid.UUID], want: list[str], proc: Any, log: Path
) -> None:
    deadline = time.monotonic() + 400
    while (got := _statuses(app, run_ids)) != want:
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, (got, log.read_text()[-4000:])
        time.sleep(0.5)


def _stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except Exception:
            proc.kill()
            proc.wait(10)


def _pool_args(app: Any, tmp_path: Path, name: str, *extra: str) -> list[str]:
    registration = mint_token(app, "registration", name=name, max_uses=1)
    # a budget any test machine passes: the memory rule has its own tests (test_take_memory)
    return ["--registration-token", registration, "--credentials-file",
            str(tmp_path / f"{name}.json"), "--name", name, "--max-runs", "3",
            "--take-retry-s", "0.5", "--checkpoint-every-versions", "1",
            "--memory-budget", "64", *extra]  # fmt: skip


def _versions(app: Any, run_id: uuid.UUID) -> list[Any]:
    with transaction(app.state.sessionmaker) as session:
        return list(
            session.execute(
                select(AdapterVersion)
                .where(AdapterVersion.run_id == run_id)
                .order_by(AdapterVersion.version)
            ).scalars()
        )


def _balanced(app: Any, run_id: uuid.UUID) -> bool:
    with transaction(app.state.sessionmaker) as session:
        return ledger_model(session, run_id).balanced


def _final_weights(live: LiveApp, run_id: uuid.UUID, tmp_path: Path) -> dict[str, Any]:
    final = _versions(live.app, run_id)[-1]
    assert final.final
    folder = tmp_path / "final" / str(run_id)
    folder.mkdir(parents=True)
    assert live.bucket is not None
    for name, meta in final.files.items():
        (folder / name).write_bytes((live.bucket / meta["key"]).read_bytes())
    return read_adapter_weights(folder)


def test_three_runs_on_one_pool_learner_train_as_they_would_alone(
    pool_live: LiveApp, tmp_path: Path, small_tokenizer: Any, small_model: Any
) -> None:
    app = pool_live.app
    runs = _three_runs(app, small_tokenizer, tmp_path)
    bad = make_run(
        app,
        dataset={"kind": "jsonl", "rows": plus_rows(2)},
        rewards=[{"name": f"{BAD_MODULE}:reward"}],
        grpo={"spot_check_fraction": 0.0},
    )
    worker_id, _ = make_worker(app)
    real_batch(app, bad.id, worker_id, 0, small_tokenizer, tmp_path)
    record = tmp_path / "steps"
    args = _pool_args(app, tmp_path, "pool-a", "--record-steps-dir", str(record),
                      "--reward-module", BAD_MODULE)  # fmt: skip
    log = pool_live.pool_learner_log
    proc = pool_live.pool_learner(args)
    try:
        everything = [*runs, bad.id]
        _wait_statuses(app, everything, ["completed"] * 3 + ["failed"], proc, log)
    finally:
        _stop(proc)
    text = log.read_text()
    with transaction(app.state.sessionmaker) as session:
        reason = session.get(Run, bad.id).status_reason  # type: ignore[union-attr]
    assert reason is not None and "cannot import" in reason and BAD_MODULE in reason, reason
    # side by side: three runs were held before the first ended
    took = [m.start() for m in re.finditer(r"took run ", text)]
    ended = re.search(r"run \S+: (done|ended)", text)
    assert ended is not None and len(took) >= 4 and took[2] < ended.start(), text[-4000:]
    assert text.count("loaded the base model") == 1, text[-4000:]
    for run_id, overrides in zip(runs, RUNS, strict=True):
        versions = _versions(app, run_id)
        assert [v.version for v in versions] == list(range(1, STEPS + 2)), versions
        assert _balanced(app, run_id)
        # the last recorded step of each version is the one published (a lost lease retrains)
        by_version = {s.version: s for s in read_steps(record / f"{run_id}.jsonl")}
        assert sorted(by_version) == list(range(1, STEPS + 1)), by_version
        with transaction(app.state.sessionmaker) as session:
            config = RunConfig.model_validate(session.get(Run, run_id).config)  # type: ignore[union-attr]
        assert config.lora.rank == overrides["lora"]["rank"]
        steps = [by_version[v] for v in sorted(by_version)]
        model = copy.deepcopy(small_model)
        trainer = replay(config, steps, pad_id=_pad(small_tokenizer), model=model)
        published = _final_weights(pool_live, run_id, tmp_path)
        replayed = {_saved_key(n): p.detach() for n, p in adapter_parameters(trainer.model)}
        assert replayed.keys() == published.keys()
        for key, tensor in published.items():
            torch.testing.assert_close(replayed[key], tensor, rtol=1e-4, atol=1e-5)
        assert any(t.abs().max() > 0 for k, t in published.items() if "lora_B" in k)


def _pad(tok: Any) -> int:
    return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)


def _saved_key(name: str) -> str:
    """PEFT's saved key of a `default` adapter's parameter."""
    return name.replace(".default", "")


def test_a_second_pool_learner_takes_the_runs_of_one_killed_mid_step(
    pool_live: LiveApp, tmp_path: Path, small_tokenizer: Any
) -> None:
    app = pool_live.app
    runs = _three_runs(app, small_tokenizer, tmp_path)
    log = pool_live.pool_learner_log
    # it stops inside its fourth step (over all three runs) and is killed there
    entry = ("tests.learner.hold_pool_step", "4")
    first = pool_live.pool_learner(_pool_args(app, tmp_path, "pool-a"), entry)
    try:
        wait_log(log, r"test hold: in a step", first, 300)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        _stop(first)
    published = {r: len(_versions(app, r)) for r in runs}
    assert any(n < STEPS + 1 for n in published.values()), published
    second = pool_live.pool_learner(_pool_args(app, tmp_path, "pool-b"))
    try:
        _wait_statuses(app, runs, ["completed"] * 3, second, log)
    finally:
        _stop(second)
    text = log.read_text()
    after = text[text.rindex("registered as pool learner") :]
    assert len(re.findall(r"took run ", after)) == 3, after[-4000:]
    for run_id in runs:
        versions = _versions(app, run_id)
        assert [v.version for v in versions] == list(range(1, STEPS + 2)), versions
        assert _balanced(app, run_id)
        # it resumed from the last version the killed learner published
        n = published[run_id]
        resumed = rf"attached to run {run_id}: fencing \d+, current version {n},"
        assert re.search(resumed, after), after[-4000:]
