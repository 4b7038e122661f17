"""The learner loop (docs/architecture/learner.md, "The learner"; docs/architecture/protocol.md,
"Learner calls"): attach → load → (claim for the version the step will join until prompts_per_step
groups → validate + score) → optimizer step → every weight_sync_steps steps publish version N+1.
With `overlap` (the default) the next step's intake and the last version's publish run on their own
threads while a step trains.

A 409 on attach: another learner holds the run; wait as a standby and retry. A lost lease (a
fenced call's `fencing_lost`, a lost heartbeat): drop the unpublished work and re-attach,
resuming the last published version's weights with the latest checkpoint at or below it. Every
other 409 is handled by its code (learner/refusals.py). `exhausted`: train on what is held and
publish `final: true`.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from learner.background import Pending
from learner.checkpoint import capture_state, load_state
from learner.config import LearnerSettings
from learner.evals import EvalScorer
from learner.frozen import FrozenWeights
from learner.heartbeat import Heartbeat
from learner.intake import Intake, IntakeResult
from learner.lr_schedule import resume_schedule_at
from learner.prepare import PreparedStep, StepPreparer
from learner.publisher import Published, Publisher, PublishJob
from learner.refusals import Diverged, reject_batch
from learner.shared_base import SharedBase, adapter_name_of
from learner.spotcheck import compare_logprobs, far_outside, reported_logprobs
from learner.step_record import record_step
from learner.tracking import Tracker
from learner.trainer import Trainer, add_lora
from learner.trajectory_metrics import trajectory_metrics
from learner.transfers import BucketRefused, Retrier
from lm.adapter_io import DEFAULT_ADAPTER
from protocol import schemas_learner as sl
from protocol.adapters import ADAPTER_WEIGHTS
from protocol.client import ApiError, AsyncGrpoClient, ConflictError
from protocol.error_codes import ATTACH_WAIT, ErrorCode
from protocol.rewards import RewardAllowlist, RewardError
from protocol.run_config import LearnerRunConfig, RunConfig
from protocol.schemas import TERMINAL_RUN_STATUSES
from protocol.staleness import staleness, trained_on

if TYPE_CHECKING:
    from learner.distributed import DataParallel

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 30.0  # how long close() waits for a background call to notice the stop
# After a heartbeat's 409: how long to wait for an answer in flight that may have completed the
# run (completing it ends the learner lease, so the 409 can come first).
SETTLE_S = 10.0


class LeaseLost(Exception):
    """The learner lease is gone (fenced 409 or failed heartbeat): drop unpublished work."""


class SpotCheckFailed(Exception):
    """A re-scored batch is far outside the policy it claims (rejected as `spot_check`)."""


class RunFinished(Exception):
    """This learner stops: the run has ended (attach refused), or it failed. `completed`: the
    run ended as completed (early stopping ends a run while its learner trains): the learner
    exits 0."""

    def __init__(self, message: str, *, completed: bool = False) -> None:
        super().__init__(message)
        self.completed = completed


class RunLost(RunFinished):
    """A pool learner's run is no longer its own: a call answered 403 `run_not_held`, or its
    re-attach found another learner holding the run. Not a crash: the pool learner takes
    again (learner/pool.py)."""


def _download_files(retrier: Retrier, files: list[sl.StoredFile], folder: Path) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for f in files:
        retrier.download(f.url, folder / f.name, f.sha256)
    return folder


def _finite(values: dict[str, Any]) -> dict[str, float | int | None]:
    out: dict[str, float | int | None] = {}
    for k, v in values.items():
        if isinstance(v, int | float) and math.isfinite(v):
            out[k] = v
    return out


class Session:
    """One attachment: the model, the trainer and the unpublished work of this fencing token.

    The main thread trains; beside it the intake thread prepares the next step (claimed for the
    version it will be trained into) and the publish thread uploads and publishes the last
    version from a snapshot (docs/architecture/learner.md, "The learner"). Both hand their
    exceptions to the main thread; `close()` stops them."""

    def __init__(self, learner: Learner, attach: sl.AttachResponse, heartbeat: Heartbeat) -> None:
        settings = learner.settings
        self.heartbeat = heartbeat
        self.learner = learner
        self.client = learner.client
        self.run_id = learner.run_id
        self.fencing = attach.fencing
        self.config: RunConfig = LearnerRunConfig.model_validate(attach.run_config)
        learner.tracker.start(self.run_id, self.config)  # once per process, redacted
        self.dir = settings.work_dir / self.run_id / f"f{self.fencing}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stopping = threading.Event()
        self.retrier = Retrier(
            self._check_lease,
            session_open=self._check_open,
            cap_s=settings.transfer_retry_cap_s,
        )
        shared = learner.shared
        self.adapter_name = DEFAULT_ADAPTER if shared is None else adapter_name_of(self.run_id)
        self.building = attach.current_version + 1  # the version the next trained step joins
        self.frozen = FrozenWeights(self.config.max_staleness)
        # the reward processes start first: a reward that cannot be imported fails the run
        # before the model is loaded
        self.intake = Intake(
            run_id=self.run_id,
            config=self.config,
            tokenizer=learner.tokenizer,
            fingerprint=learner.fingerprint,
            work_dir=self.dir,
            download=self.retrier.download,
            reward_timeout_s=settings.reward_timeout_s,
            reward_processes=settings.reward_processes,
            rewards_allowed=learner.rewards_allowed,
            outbound=settings.outbound_policy(),
        )
        try:
            self.trainer = self._load(attach)
        except BaseException:
            self.intake.close()
            self._drop_adapter()
            raise
        for f in attach.resume_adapter or []:
            if f.name == ADAPTER_WEIGHTS:  # the server's version sha256 (content address)
                self.intake.adapter_sha256[attach.current_version] = f.sha256
        self.prepare = StepPreparer(
            client=learner.intake_client,
            run_id=self.run_id,
            fencing=self.fencing,
            intake=self.intake,
            prompts_per_step=self.config.prompts_per_step,
            claim_wait_s=settings.claim_wait_s,
            last_version=_last_version(self.config.max_versions, settings.max_versions),
            alive=self._check_lease,
        )
        self.publisher = Publisher(
            client=learner.publish_client,
            retrier=self.retrier,
            run_id=self.run_id,
            fencing=self.fencing,
            model=self.trainer.model,
            work_dir=self.dir,
            adapter_sha256=self.intake.adapter_sha256,
            base_model=self.config.base_model,
            adapter_name=self.adapter_name,
            turn=self._turn,
        )
        self.evals: EvalScorer | None = None
        if self.config.eval is not None:
            self.evals = EvalScorer(
                client=learner.eval_client,
                run_id=self.run_id,
                fencing=self.fencing,
                intake=self.intake,
                config=self.config.eval,
                tracker=learner.tracker,
            )
        self.training_over = attach.run_status == "evaluating"
        self.next_step: Pending[PreparedStep] | None = None
        self.publishing: Pending[Published] | None = None
        self.consumed: list[uuid.UUID] = []
        self.steps_since_publish = 0
        self.checkpointed_this_session = False
        self.last_train_metrics: dict[str, Any] = {}
        self.last_publish_s: float | None = None
        self.rng = random.Random(self.config.seed * 1_000_003 + self.fencing)

    def _load(self, attach: sl.AttachResponse) -> Trainer:
        from lm.adapter_io import snapshot_adapter

        dp, device, name = self.learner.dp, self.learner.device, self.adapter_name
        folder = None
        if attach.resume_adapter:
            folder = _download_files(
                self.retrier, attach.resume_adapter, self.dir / "resume" / "adapter"
            )
        with self._turn():
            model = self._build_model(folder)
            if dp is not None and dp.fsdp:
                dp.shard(model)
            trainer = Trainer(
                model,
                self.config,
                pad_id=self.learner.pad_id,
                device=device,
                dp=dp,
                adapter_name=name,
            )
            if attach.current_version > 0:
                self.frozen.keep(attach.current_version, snapshot_adapter(model, name))
        if attach.resume_checkpoint:
            self._restore(trainer, attach)
        elif attach.current_version > 0:
            log.warning(
                "version %d has no checkpoint at or below it: the optimizer starts fresh",
                attach.current_version,
            )
        if dp is not None:  # the other ranks build the same model and take this state
            dp.scatter("session", [attach.run_config] * dp.world_size)
            dp.share_trainer_state(trainer)
        return trainer

    def _build_model(self, resume: Path | None) -> Any:
        """The run's adapter on its base model: a pool learner's shared base gains it (the
        base loaded once); a per-run learner loads the base for itself."""
        from lm.adapter_io import load_adapter_version
        from lm.models import load_model

        shared = self.learner.shared
        if shared is not None:
            return shared.add(self.adapter_name, self.config, resume)
        dtype = getattr(torch, self.learner.settings.dtype)
        base = load_model(self.config.base_model, dtype=dtype, device=self.learner.device)
        if resume is not None:
            return load_adapter_version(base, resume, is_trainable=True)
        return add_lora(base, self.config)

    @contextmanager
    def _turn(self) -> Iterator[None]:
        """Where this run reads or changes the model: a pool learner's runs share it and take
        turns (learner/shared_base.py), this run's adapter active in its turn."""
        shared = self.learner.shared
        if shared is None:
            yield
            return
        with shared.turn():
            if getattr(self, "trainer", None) is not None:
                self.trainer.activate()
            yield

    def _restore(self, trainer: Trainer, attach: sl.AttachResponse) -> None:
        """The current version's adapter weights (loaded) with the latest checkpoint's
        optimizer state, which may be some versions older (checkpoint_every_versions)."""
        assert attach.resume_checkpoint is not None
        folder = _download_files(
            self.retrier, attach.resume_checkpoint, self.dir / "resume" / "checkpoint"
        )
        state = load_state(
            folder,
            names=trainer.param_names,
            optimizer=trainer.optimizer,
            scheduler=trainer.scheduler,
        )
        step = attach.resume_learner_step
        trainer.step = int(state["step"] if step is None else step)
        resume_schedule_at(trainer.scheduler, trainer.step)
        log.info(
            "resuming version %d (step %d) with the optimizer state of version %s",
            attach.current_version,
            trainer.step,
            attach.resume_checkpoint_version,
        )

    # -- the loop -----------------------------------------------------------------------------

    def _check_lease(self) -> None:
        if self.heartbeat.lost.is_set():
            raise LeaseLost("heartbeat answered 409")
        self._check_open()

    def _check_open(self) -> None:
        if self.stopping.is_set():
            raise LeaseLost("the session is stopping")

    def _lease_ended_by_the_server(self) -> bool:
        return self.heartbeat.lost.is_set() and not self.stopping.is_set()

    def _check_background(self) -> None:
        """Raise a background publish's failure (or a lost lease) on the main thread."""
        self._check_lease()
        if self.publishing is not None and self.publishing.error() is not None:
            self.publishing.result()

    def _request_step(self, target_version: int) -> None:
        self.next_step = Pending(
            "learner-intake",
            lambda: self.prepare(target_version),
            background=self.learner.settings.overlap,
        )

    def run(self) -> bool:
        """Train until the run completes or this process's max_versions (True)."""
        self.last_step_end = time.perf_counter()
        if self.evals is not None:
            self.evals.start()
        if self.training_over:  # re-attached after the final publish: only evals are left
            return self._wait_evaluated()
        self._request_step(self.building)
        while True:
            assert self.next_step is not None
            waited = time.perf_counter()
            step = self.next_step.result(self._check_background)
            intake_wait_s = time.perf_counter() - waited
            if step.end == "beyond":
                self._wait_publish()
                return True
            accepted = self._accept(step)
            closes_version = (
                bool(accepted) and self.steps_since_publish + 1 >= self.config.weight_sync_steps
            )
            if step.end == "more":
                self._request_step(self.building + 1 if closes_version else self.building)
            if accepted:
                self._train(accepted, intake_wait_s)
            if step.end == "exhausted":
                self._wait_publish()
                self._start_publish(final=True)
                self._wait_publish()
                return True
            if closes_version and self._publish_and_maybe_stop():
                return True

    def _publish_and_maybe_stop(self) -> bool:
        """Hand the version over once the previous one has landed; True when the run (or this
        process's max_versions) ends with it."""
        if self._wait_publish():
            return True
        version = self._start_publish(final=False)
        limit = self.learner.settings.max_versions
        at_limit = limit is not None and version >= limit
        # the serial loop (overlap off) publishes before it claims again
        if (at_limit or not self.learner.settings.overlap) and self._wait_publish():
            return True
        return at_limit

    def _accept(self, step: PreparedStep) -> list[IntakeResult]:
        """Spot-check a fraction of the step's batches (here, on the training thread, between
        optimizer steps); the rest are trained on."""
        accepted: list[IntakeResult] = []
        for result in step.results:
            batch = result.batch
            try:
                self._maybe_spot_check(result)
            except SpotCheckFailed as exc:
                log.warning("rejecting batch %s after its spot check: %s", batch.batch_id, exc)
                reject_batch(
                    self.client,
                    self.run_id,
                    str(batch.batch_id),
                    self.fencing,
                    "spot_check",
                    str(exc),
                )
                continue
            accepted.append(result)
            self.consumed.append(batch.batch_id)
        return accepted

    def _maybe_spot_check(self, result: IntakeResult) -> None:
        """Re-score a fraction of batches with a frozen copy of the weights of the version
        that sampled them (kept while batches of that version can arrive)."""
        from lm.logprobs import completion_logprobs

        settings = self.learner.settings
        fraction = settings.spot_check_fraction
        if fraction is None:
            fraction = self.config.grpo.spot_check_fraction
        batch = result.batch
        if self.rng.random() >= fraction:
            return
        dp = self.learner.dp
        if dp is not None and dp.fsdp:  # a forward on rank 0 alone would wait for the others
            log.info("no spot check for batch %s: the base weights are sharded", batch.batch_id)
            return
        if not self.frozen.has(batch.adapter_version):
            log.info(
                "no spot check for batch %s: version %d was published before this learner attached",
                batch.batch_id,
                batch.adapter_version,
            )
            return
        model = self.trainer.model
        rows = result.data.rows
        with self._turn(), self.frozen.scoring_with(model, batch.adapter_version) as use_adapter:
            recomputed = completion_logprobs(
                model,
                [r.prompt_token_ids for r in rows],
                [r.token_ids[r.prompt_tokens :] for r in rows],
                self.config.sampling.temperature,
                pad_id=self.learner.pad_id,
                use_adapter=use_adapter,
                masks=[r.loss_mask[r.prompt_tokens :] for r in rows],
            )
        check = compare_logprobs(reported_logprobs(rows), recomputed)
        self.client.spot_check(
            self.run_id,
            sl.SpotCheckRequest(
                fencing=self.fencing,
                worker_id=batch.worker_id,
                batch_id=batch.batch_id,
                mean_abs_logprob_diff=check.mean_abs_diff,
                kl=check.kl,
                n_tokens=check.n_tokens,
            ),
        )
        threshold = self.config.alarms.spot_check_mismatch
        if far_outside(check, threshold, settings.spot_check_reject_factor):
            raise SpotCheckFailed(
                f"mean |Δ log-prob| {check.mean_abs_diff:.4f} > {settings.spot_check_reject_factor}"
                f" × {threshold}"
            )

    def _train(self, accepted: list[IntakeResult], intake_wait_s: float) -> None:
        groups = [g for r in accepted for g in r.groups]
        with self._turn():
            metrics = self.trainer.train_step(groups)
        now = time.perf_counter()
        log.info("trained step %d on %d groups", self.trainer.step, len(groups))
        compute_s = metrics["compute_s"]
        wall_s = now - self.last_step_end
        self.last_step_end = now
        metrics["learner_busy"] = min(1.0, compute_s / wall_s) if wall_s > 0 else 1.0
        metrics["intake_wait_s"] = intake_wait_s
        if self.last_publish_s is not None:
            metrics["publish_s"] = self.last_publish_s
        trained_on_version = trained_on(self.building)
        lags = [staleness(trained_on_version, r.batch.adapter_version) for r in accepted]
        metrics["staleness"] = float(sum(lags)) / len(lags)
        if self.config.environment.name != "single_turn":
            metrics.update(trajectory_metrics([row for r in accepted for row in r.data.rows]))
        folder = self.learner.settings.record_steps_dir
        if folder is not None:
            record_step(
                folder,
                self.run_id,
                step=self.trainer.step,
                version=self.building,
                batch_ids=[r.batch.batch_id for r in accepted],
                groups=groups,
            )
        self.steps_since_publish += 1
        self.last_train_metrics = metrics
        point = sl.MetricPointIn(
            step=self.trainer.step, version=self.building, values=_finite(metrics)
        )
        self.client.post_learner_metrics(self.run_id, self.fencing, [point])
        self.learner.tracker.log_step(self.trainer.step, self.building, point.values)

    def _carries_checkpoint(self, version: int, final: bool) -> bool:
        """The resume checkpoint travels with every checkpoint_every_versions-th version, the
        first version and the final one, and the first version of each attachment (so a
        restart never leaves the run further than that from a checkpoint)."""
        every = self.learner.settings.checkpoint_every_versions
        first_here = not self.checkpointed_this_session
        return final or first_here or version == 1 or version % every == 0

    def _start_publish(self, *, final: bool) -> int:
        """Snapshot the version being built and hand it to the publish thread."""
        from lm.adapter_io import snapshot_adapter

        version, t = self.building, self.trainer
        checkpoint = None
        if self._carries_checkpoint(version, final):
            checkpoint = capture_state(
                names=t.param_names,
                optimizer=t.optimizer,
                scheduler=t.scheduler,
                step=t.step,
                version=version,
            )
            self.checkpointed_this_session = True
        with self._turn():
            weights = snapshot_adapter(t.model, self.adapter_name)
        job = PublishJob(
            version=version,
            weights=weights,
            checkpoint=checkpoint,
            consumed=self.consumed,
            learner_step=t.step,
            metrics=_finite(self.last_train_metrics),
            final=final,
        )
        self.frozen.keep(version, weights)
        self.consumed, self.steps_since_publish = [], 0
        self.building += 1
        overlap = self.learner.settings.overlap
        self.publishing = Pending(
            "learner-publish", lambda: self.publisher(job), background=overlap
        )
        return version

    def _wait_publish(self) -> bool:
        """Wait for the version being published; True when the run ended with it."""
        if self.publishing is None:
            return False
        try:
            result = self.publishing.result(self._check_lease)
        except LeaseLost as lost:
            result = self._publish_that_ended_the_run(lost)
        self.last_publish_s = self.publishing.seconds
        self.publishing = None
        self.frozen.prune(result.version)
        if result.run_status == "evaluating":
            return self._wait_evaluated()
        # A paused (or budget-exhausted) run keeps its learner: it resumes where it stopped.
        return result.run_status in TERMINAL_RUN_STATUSES

    def _publish_that_ended_the_run(self, lost: LeaseLost) -> Published:
        """After a heartbeat's 409 during a publish: the publish's own answer when that publish
        completed the run, else the LeaseLost again. Completing the run ends the learner lease,
        so the heartbeat can see the 409 before the publish thread has handed back the answer
        that caused it. Taking that answer is safe: a publish under a lost fencing token fails."""
        publishing = self.publishing
        assert publishing is not None
        if self._lease_ended_by_the_server():
            publishing.join(SETTLE_S)
        if publishing.done and publishing.error() is None:
            result = publishing.result()
            if result.run_status in TERMINAL_RUN_STATUSES:
                return result
        raise lost

    def _wait_evaluated(self) -> bool:
        """After the final publish: wait while the eval thread scores the last evals; True
        once the server has completed the run (LeaseLost when the lease goes meanwhile)."""
        assert self.evals is not None
        log.info("the final version is published; scoring its evaluation")
        while not self.evals.finished.wait(0.5):
            try:
                self._check_lease()
            except LeaseLost:
                # the eval answer that completed the run may be in flight (SETTLE_S)
                if self._lease_ended_by_the_server() and self.evals.finished.wait(SETTLE_S):
                    return True
                raise
            if self.evals.lost.is_set() or not self.evals.is_alive():
                raise LeaseLost("the eval scorer stopped before the run completed")
        return True

    def close(self) -> None:
        """Stop the background calls (their next lease check raises) and wait for them."""
        self.stopping.set()
        if self.evals is not None:
            self.evals.stopped.set()
        self.intake.close()  # a reward running on the intake thread ends at once
        for call in (self.next_step, self.publishing):
            if call is not None:
                call.join(CLOSE_WAIT_S)
        if self.evals is not None:
            self.evals.stop(CLOSE_WAIT_S)
        self._drop_adapter()

    def _drop_adapter(self) -> None:
        """The run's adapter leaves a pool learner's shared model with its session."""
        shared = self.learner.shared
        if shared is not None:
            with shared.turn():
                shared.remove(self.adapter_name)


def _last_version(run_limit: int | None, process_limit: int | None) -> int | None:
    limits = [v for v in (run_limit, process_limit) if v is not None]
    return min(limits) if limits else None


class Learner:
    """Attach (standby on 409), run a session, re-attach on a lost lease. `pool`: the run was
    taken by a pool learner (its token in `settings.token`): a 403 `run_not_held`, or another
    learner holding the run, ends this Learner with RunLost instead of a standby."""

    pool: bool = False

    def __init__(
        self,
        settings: LearnerSettings,
        client: AsyncGrpoClient | None = None,
        dp: DataParallel | None = None,
        *,
        pool: bool = False,
        shared: SharedBase | None = None,
    ):
        from lm.chat import tokenizer_fingerprint
        from lm.models import load_tokenizer, set_threads

        self.settings = settings
        self.pool = pool
        self.shared = shared  # a pool learner's one base model for all its runs, or None
        self.stopped = threading.Event()  # stop(): a pool learner stopping all its runs
        self.session: Session | None = None
        self.dp = dp  # rank 0 of a data-parallel learner (learner/distributed.py), or None
        self.device = dp.device if dp is not None else settings.device
        set_threads(settings.threads)
        self.client = client or AsyncGrpoClient(settings.server_url, settings.token, max_retries=30)
        self.heartbeat_client = AsyncGrpoClient(settings.server_url, settings.token)
        # the intake and publish threads each have their own connection pool; the publish
        # thread's calls are retried by its Retrier, which checks the lease between attempts
        self.intake_client = AsyncGrpoClient(settings.server_url, settings.token, max_retries=30)
        self.publish_client = AsyncGrpoClient(settings.server_url, settings.token, max_retries=0)
        self.eval_client = AsyncGrpoClient(settings.server_url, settings.token, max_retries=30)
        # attach reports the tokenizer fingerprint, so the tokenizer comes before the run config
        self.tokenizer: Any = load_tokenizer(settings.model)
        self.fingerprint = str(tokenizer_fingerprint(self.tokenizer))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.rewards_allowed = RewardAllowlist.discover(settings.reward_modules)
        self.tracker = Tracker(settings)  # W&B / trackio / MLflow mirror; close() it at exit

    def stop(self) -> None:
        """Stop at the next check (from another thread): the session's background calls end,
        and `run` raises RunFinished instead of re-attaching."""
        self.stopped.set()
        session = self.session
        if session is not None:
            session.stopping.set()

    def _check_stopped(self) -> None:
        if self.stopped.is_set():
            raise RunFinished("stopped")

    @property
    def run_id(self) -> str:
        run_id = self.settings.run_id
        assert run_id is not None, "a Learner trains one run (settings.run_id)"
        return run_id

    def attach(self) -> sl.AttachResponse:
        """Attach, waiting as a standby while another learner holds the run."""
        while True:
            try:
                return self.client.learner_attach(
                    self.run_id,
                    self.fingerprint,
                    name=self.settings.name,
                    reward_names=self.rewards_allowed.names(),
                    model=self.settings.model,
                )
            except ApiError as exc:
                if self.pool and exc.code in (
                    ErrorCode.run_not_held,
                    ErrorCode.held_by_another_learner,
                ):
                    lost = f"the run is no longer this pool learner's: {exc.detail}"
                    raise RunLost(lost) from exc
                # Branch on the code, never on the words (protocol/error_codes.py): preparing
                # and another learner's lease pass; any other refusal (the run ended or does
                # not exist, another tokenizer or model, a reward this host cannot load, a
                # token the server refuses) a retry would meet again. 5xx: the client retried.
                if exc.code not in ATTACH_WAIT:
                    if exc.status_code >= 500:
                        raise
                    body = exc.body if isinstance(exc.body, dict) else {}
                    completed = (
                        exc.code == ErrorCode.run_ended and body.get("status") == "completed"
                    )
                    raise RunFinished(str(exc.detail), completed=completed) from exc
                if exc.code == ErrorCode.run_preparing:
                    log.info("the run is preparing its prompt rows; waiting")
                else:
                    log.info("another learner holds the run; standing by")
                time.sleep(self.settings.standby_retry_s)
                self._check_stopped()

    def _check_collective_timeout(self, attach: sl.AttachResponse) -> None:
        """A data-parallel learner's collectives must time out before its lease would lapse
        (a hung group would otherwise hold the run)."""
        timeout = self.settings.collective_timeout_s
        if self.dp is not None and timeout >= attach.lease_ttl_s:
            raise RunFinished(
                f"collective_timeout_s {timeout:g} must be shorter than the run's learner lease "
                f"TTL ({attach.lease_ttl_s:g} s): set --collective-timeout-s or "
                "ASYNCGRPO_LEARNER_COLLECTIVE_TIMEOUT_S lower"
            )

    def _fail(self, fencing: int, reason: str) -> NoReturn:
        """An error in the run's own configuration, which a restart would meet again: the run
        becomes `failed` with the reason, and this learner stops."""
        log.error("the run cannot go on: %s", reason)
        try:
            self.client.fail_run(self.run_id, fencing, reason)
        except ConflictError as exc:
            log.warning("could not mark the run failed (%s)", exc.detail)
        raise RunFinished(f"run failed: {reason}")

    def run(self) -> None:
        """Train until the run completes (or max_versions of this process)."""
        while True:
            self._check_stopped()
            attach = self.attach()  # refused (RunFinished) when --model is not the run's
            log.info(
                "attached to run %s: fencing %d, current version %d, resuming from checkpoint "
                "of version %s",
                self.run_id,
                attach.fencing,
                attach.current_version,
                attach.resume_checkpoint_version,
            )
            self._check_collective_timeout(attach)
            # the heartbeat runs from the attach on: loading the model may outlast the TTL
            heartbeat = Heartbeat(
                self.heartbeat_client,
                self.run_id,
                attach.fencing,
                attach.heartbeat_interval_s,
                gate=self.dp.watchdog.overdue if self.dp is not None else None,
            )
            heartbeat.start()
            session: Session | None = None
            try:
                session = self.session = Session(self, attach, heartbeat)
                if self.stopped.is_set():  # stop() came while the session was being built
                    session.stopping.set()
                if session.run():
                    return
            except (LeaseLost, BucketRefused) as exc:
                self._check_stopped()
                log.warning("learner lease lost (%s); dropping unpublished work, re-attaching", exc)
            except Diverged as exc:
                log.warning(
                    "the server's record does not fit this session (%s); dropping unpublished "
                    "work, re-attaching",
                    exc,
                )
            except ConflictError as exc:  # only a lost lease re-attaches (learner/refusals.py)
                if not exc.lease_lost:
                    raise
                log.warning("learner lease lost (%s); dropping unpublished work, re-attaching", exc)
            except RewardError as exc:
                self._fail(attach.fencing, f"reward: {exc}")
            except ApiError as exc:  # a pool learner's run taken from it (revoke, another take)
                if exc.code != ErrorCode.run_not_held:
                    raise
                raise RunLost(f"the run is no longer this pool learner's: {exc.detail}") from exc
            finally:
                self.session = None
                if session is not None:
                    session.close()
                heartbeat.stopped.set()
