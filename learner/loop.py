"""The learner loop (docs/architecture.md, "Protocol": learner calls): attach → load → claim
until prompts_per_step groups → validate + score → optimizer step → every weight_sync_steps
steps publish version N+1.

A 409 on attach: another learner holds the run; wait as a standby and retry. A 409 on a fenced
call (or a lost heartbeat): drop the unpublished work and re-attach, resuming from the last
published version's checkpoint. `exhausted`: train on what is held and publish `final: true`.
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NoReturn

import torch

from learner.checkpoint import load_state, save_state
from learner.config import LearnerSettings
from learner.data import Group
from learner.intake import Intake, IntakeResult
from learner.spotcheck import compare_logprobs, far_outside
from learner.trainer import Trainer, add_lora
from learner.transfers import BucketRefused, Retrier, transient_api, upload_version_files
from protocol import schemas_learner as sl
from protocol.adapters import ADAPTER_WEIGHTS
from protocol.batches import BatchRejected
from protocol.client import AsyncGrpoClient, ConflictError
from protocol.rewards import RewardError
from protocol.run_config import RunConfig
from protocol.schemas import TERMINAL_RUN_STATUSES
from protocol.staleness import staleness
from protocol.storage import sha256_file

log = logging.getLogger(__name__)
IDLE_SLEEP_S = 0.5


class LeaseLost(Exception):
    """The learner lease is gone (fenced 409 or failed heartbeat): drop unpublished work."""


class SpotCheckFailed(Exception):
    """A re-scored batch is far outside the policy it claims (rejected as `spot_check`)."""


class RunFinished(Exception):
    """This learner stops: the run has ended (attach refused), or it failed."""


class Heartbeat(threading.Thread):
    """Keeps the learner lease; sets `lost` on a 409."""

    def __init__(self, client: AsyncGrpoClient, run_id: str, fencing: int, interval: float):
        super().__init__(daemon=True, name="learner-heartbeat")
        self.client, self.run_id, self.fencing, self.interval = client, run_id, fencing, interval
        self.lost = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.client.learner_heartbeat(self.run_id, self.fencing)
            except ConflictError:
                self.lost.set()
                return
            except Exception:  # transient: the next beat retries; the lease TTL decides
                log.warning("learner heartbeat failed", exc_info=True)


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
    """One attachment: the model, the trainer and the unpublished work of this fencing token."""

    def __init__(self, learner: Learner, attach: sl.AttachResponse, heartbeat: Heartbeat) -> None:
        self.heartbeat = heartbeat
        self.learner = learner
        self.client = learner.client
        self.run_id = learner.settings.run_id
        self.fencing = attach.fencing
        self.version = attach.current_version
        self.config = RunConfig.model_validate(attach.run_config)
        self.dir = learner.settings.work_dir / self.run_id / f"f{self.fencing}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.retrier = Retrier(self._check_lease, cap_s=learner.settings.transfer_retry_cap_s)
        self.trainer = self._load(attach)
        self.intake = Intake(
            run_id=self.run_id,
            config=self.config,
            tokenizer=learner.tokenizer,
            fingerprint=learner.fingerprint,
            work_dir=self.dir,
            download=self.retrier.download,
        )
        for f in attach.resume_adapter or []:
            if f.name == ADAPTER_WEIGHTS:  # the server's version sha256 (content address)
                self.intake.adapter_sha256[self.version] = f.sha256
        self.consumed: list[uuid.UUID] = []
        self.pending: list[Group] = []
        self.steps_since_publish = 0
        self.last_metrics: dict[str, Any] = {}
        self.rng = random.Random(self.config.seed * 1_000_003 + self.fencing)

    def _load(self, attach: sl.AttachResponse) -> Trainer:
        from lm.adapter_io import load_adapter_version
        from lm.models import load_model

        settings = self.learner.settings
        torch.manual_seed(self.config.seed)
        dtype = getattr(torch, settings.dtype)
        base = load_model(self.config.base_model, dtype=dtype, device=settings.device)
        if attach.resume_adapter:
            folder = _download_files(
                self.retrier, attach.resume_adapter, self.dir / "resume" / "adapter"
            )
            model = load_adapter_version(base, folder, is_trainable=True)
        else:
            model = add_lora(base, self.config)
        trainer = Trainer(model, self.config, pad_id=self.learner.pad_id, device=settings.device)
        if attach.resume_checkpoint:
            folder = _download_files(
                self.retrier, attach.resume_checkpoint, self.dir / "resume" / "checkpoint"
            )
            state = load_state(
                folder,
                names=trainer.param_names,
                optimizer=trainer.optimizer,
                scheduler=trainer.scheduler,
            )
            trainer.step = int(state["step"])
        return trainer

    # -- the loop -----------------------------------------------------------------------------

    def _check_lease(self) -> None:
        if self.heartbeat.lost.is_set():
            raise LeaseLost("heartbeat answered 409")

    def run(self) -> bool:
        """Train until the run completes or this process's max_versions (True)."""
        per_step = self.config.prompts_per_step
        while True:
            self._check_lease()
            need = per_step - len(self.pending)
            claim = self.client.claim_batches(
                self.run_id, self.fencing, need, wait_s=self.learner.settings.claim_wait_s
            )
            for batch in claim.batches:
                self._take(batch, claim.current_version)
            if not claim.batches and not claim.exhausted:
                time.sleep(IDLE_SLEEP_S)  # the server may answer at once when nothing is ready
            if len(self.pending) >= per_step:
                self._train()
                if self.steps_since_publish >= self.config.weight_sync_steps:
                    if self._publish(final=False):
                        return True
            if claim.exhausted and not claim.batches:
                if self.pending:
                    self._train()
                self._publish(final=True)
                return True

    def _take(self, batch: sl.ClaimedBatch, current_version: int) -> None:
        try:
            result = self.intake.load(batch)
            self._maybe_spot_check(result)
        except BatchRejected as exc:
            log.warning("rejecting batch %s: %s", batch.batch_id, exc)
            self.client.reject_batch(
                self.run_id, str(batch.batch_id), self.fencing, exc.reason, exc.detail[:2000]
            )
            return
        except SpotCheckFailed as exc:
            log.warning("rejecting batch %s after its spot check: %s", batch.batch_id, exc)
            self.client.reject_batch(
                self.run_id, str(batch.batch_id), self.fencing, "spot_check", str(exc)
            )
            return
        self.pending.extend(result.groups)
        self.consumed.append(batch.batch_id)
        self.last_metrics["staleness"] = float(staleness(current_version, batch.adapter_version))

    def _maybe_spot_check(self, result: IntakeResult) -> None:
        """Re-score a fraction of batches. Only batches sampled with the weights the trainer
        holds right now can be re-scored without another download (this version, no step
        since its publish; version 0 with the adapter disabled)."""
        from lm.logprobs import completion_logprobs

        settings = self.learner.settings
        fraction = settings.spot_check_fraction
        if fraction is None:
            fraction = self.config.grpo.spot_check_fraction
        batch = result.batch
        if self.rng.random() >= fraction:
            return
        if batch.adapter_version != self.version or self.steps_since_publish != 0:
            return
        recomputed = completion_logprobs(
            self.trainer.model,
            result.data.prompt_token_ids,
            result.data.completion_token_ids,
            self.config.sampling.temperature,
            pad_id=self.learner.pad_id,
            use_adapter=batch.adapter_version != 0,
        )
        check = compare_logprobs(result.data.behaviour_logprobs, recomputed)
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

    def _train(self) -> None:
        groups, self.pending = self.pending, []
        metrics = self.trainer.train_step(groups)
        log.info("trained step %d on %d groups", self.trainer.step, len(groups))
        metrics.update(self.last_metrics)
        self.steps_since_publish += 1
        self.last_metrics = {}
        self.last_train_metrics = metrics
        point = sl.MetricPointIn(
            step=self.trainer.step, version=self.version + 1, values=_finite(metrics)
        )
        self.client.post_learner_metrics(self.run_id, self.fencing, [point])

    def _publish(self, *, final: bool) -> bool:
        """Upload adapter + checkpoint of version N+1 and publish; True when the run is done."""
        from lm.adapter_io import save_adapter_version

        version = self.version + 1
        out = self.dir / f"v{version:06d}"
        if out.exists():
            shutil.rmtree(out)
        manifest = save_adapter_version(self.trainer.model, out / "adapter")
        t = self.trainer
        save_state(
            out / "checkpoint",
            names=t.param_names,
            optimizer=t.optimizer,
            scheduler=t.scheduler,
            step=t.step,
            version=version,
        )
        files: list[tuple[Path, str]] = [
            (out / "adapter" / f.name, "adapter") for f in manifest.files
        ]
        files += [(p, "checkpoint") for p in sorted((out / "checkpoint").iterdir())]
        uploads = [
            sl.UploadFile(name=p.name, size=p.stat().st_size, sha256=sha256_file(p), kind=kind)  # type: ignore[arg-type]
            for p, kind in files
        ]
        request = sl.UploadsRequest(fencing=self.fencing, version=version, files=uploads)
        keys = upload_version_files(
            self.retrier, self.client, self.run_id, request, {(k, p.name): p for p, k in files}
        )
        published: dict[str, list[sl.PublishedFile]] = {"adapter": [], "checkpoint": []}
        for u in uploads:
            key = keys[(u.kind, u.name)]
            published[u.kind].append(
                sl.PublishedFile(name=u.name, key=key, sha256=u.sha256, size=u.size)
            )
        metrics = _finite(getattr(self, "last_train_metrics", {}))
        body = sl.PublishRequest(
            fencing=self.fencing,
            version=version,
            files=published["adapter"],
            checkpoint_files=published["checkpoint"],
            learner_step=t.step,
            metrics=metrics,
            consumed_batch_ids=self.consumed,
            final=final,
        )
        # a 5xx (the server's own bucket check failing) is retried; a publish that landed
        # but whose answer was lost answers 409 on the retry: re-attach resumes from it
        result = self.retrier.call(
            f"publish of version {version}",
            lambda: self.client.publish_adapter(self.run_id, body),
            transient_api,
        )
        log.info("published version %d (%s)", version, result.run_status)
        self.version = version
        self.intake.adapter_sha256[version] = manifest.version_sha256()
        self.consumed = []
        self.steps_since_publish = 0
        shutil.rmtree(out, ignore_errors=True)
        max_versions = self.learner.settings.max_versions
        # A paused (or budget-exhausted) run keeps its learner: it resumes where it stopped.
        done = result.run_status in TERMINAL_RUN_STATUSES or (
            max_versions is not None and version >= max_versions
        )
        return bool(final or done)


class Learner:
    """Attach (standby on 409), run a session, re-attach on a lost lease."""

    def __init__(self, settings: LearnerSettings, client: AsyncGrpoClient | None = None):
        from lm.chat import tokenizer_fingerprint
        from lm.models import load_tokenizer, set_threads

        self.settings = settings
        set_threads(settings.threads)
        self.client = client or AsyncGrpoClient(settings.server_url, settings.token, max_retries=30)
        self.heartbeat_client = AsyncGrpoClient(settings.server_url, settings.token)
        # attach reports the tokenizer fingerprint, so the tokenizer comes before the run config
        self.tokenizer: Any = load_tokenizer(settings.model)
        self.fingerprint = str(tokenizer_fingerprint(self.tokenizer))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)

    def attach(self) -> sl.AttachResponse:
        """Attach, waiting as a standby while another learner holds the run."""
        while True:
            try:
                return self.client.learner_attach(
                    self.settings.run_id, self.fingerprint, name=self.settings.name
                )
            except ConflictError as exc:
                if "run is " in str(exc.detail) or "fingerprint" in str(exc.detail):
                    raise RunFinished(str(exc.detail)) from exc
                log.info("another learner holds the run; standing by")
                time.sleep(self.settings.standby_retry_s)

    def _fail(self, fencing: int, reason: str) -> NoReturn:
        """An error in the run's own configuration, which a restart would meet again: the run
        becomes `failed` with the reason, and this learner stops."""
        log.error("the run cannot go on: %s", reason)
        try:
            self.client.fail_run(self.settings.run_id, fencing, reason)
        except ConflictError as exc:
            log.warning("could not mark the run failed (%s)", exc.detail)
        raise RunFinished(f"run failed: {reason}")

    def run(self) -> None:
        """Train until the run completes (or max_versions of this process)."""
        while True:
            attach = self.attach()
            base = RunConfig.model_validate(attach.run_config).base_model
            if base != self.settings.model:
                raise RunFinished(
                    f"the run trains {base!r} but this learner loaded {self.settings.model!r}"
                    " (--model)"
                )
            # the heartbeat runs from the attach on: loading the model may outlast the TTL
            heartbeat = Heartbeat(
                self.heartbeat_client,
                self.settings.run_id,
                attach.fencing,
                attach.heartbeat_interval_s,
            )
            heartbeat.start()
            try:
                if Session(self, attach, heartbeat).run():
                    return
            except (ConflictError, LeaseLost, BucketRefused) as exc:
                log.warning("learner lease lost (%s); dropping unpublished work, re-attaching", exc)
            except RewardError as exc:
                self._fail(attach.fencing, f"reward: {exc}")
            finally:
                heartbeat.stopped.set()
