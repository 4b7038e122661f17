"""Claimed batch → groups ready to train: download with sha256, the validating reader (with the
learner's own prompt tokenization, so mismatches are `prompt_mismatch`), rewards on the decoded
completions and the rows' reference columns, scored in child processes (learner/reward_pool.py;
a reward that raises or times out on the batch rejects it `reward_error`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from learner.data import Completion, Group
from learner.reward_pool import RewardBatchFailed, RewardPool
from learner.transfers import ObjectMissing
from protocol.batch_format import METADATA_KEY
from protocol.batches import BatchExpectations, BatchRejected, RolloutBatchData, read_batch
from protocol.layout import parse_batch_key
from protocol.outbound import PUBLIC_ONLY, OutboundPolicy
from protocol.rewards import BUILTINS_ONLY, CombinedRewards, RewardAllowlist
from protocol.run_config import RunConfig
from protocol.schemas_learner import ClaimedBatch, ClaimedEvalBatch
from protocol.transfer import ChecksumMismatch, download_url


@dataclass(frozen=True)
class BatchSpec:
    """What the lease said a batch must be (training or eval)."""

    bucket_key: str
    worker_id: str
    version: int
    sha256: str
    prompts: dict[int, Any]  # prompt row (or eval item) id -> prompt
    group_size: int
    max_new_tokens: int
    kind: Literal["train", "eval"] = "train"


@dataclass
class IntakeResult:
    batch: ClaimedBatch
    data: RolloutBatchData
    groups: list[Group]
    rewards_by_name: dict[str, list[float]]


class Intake:
    """Downloads, validates and scores claimed batches for one run. Starting it starts the
    reward processes and raises RewardError when a reward cannot be resolved; `close()` (or
    `with`) stops them."""

    def __init__(
        self,
        *,
        run_id: str,
        config: RunConfig,
        tokenizer: Any,
        fingerprint: str,
        work_dir: Path,
        download: Callable[[str, Path, str | None], int] = download_url,
        reward_timeout_s: float = 60.0,
        reward_processes: int = 1,
        rewards_allowed: RewardAllowlist = BUILTINS_ONLY,
        outbound: OutboundPolicy = PUBLIC_ONLY,
    ) -> None:
        self.run_id = run_id
        self.config = config
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint
        self.work_dir = work_dir
        self.download = download  # the learner passes one that retries through an outage
        self.adapter_sha256: dict[int, str | None] = {0: None}  # versions whose sha256 we know
        self.rewards = RewardPool(
            config.rewards,
            timeout_s=reward_timeout_s,
            processes=reward_processes,
            allowed=rewards_allowed,
            outbound=outbound,
        )

    def close(self) -> None:
        self.rewards.close()

    def __enter__(self) -> Intake:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _expectations(self, spec: BatchSpec, adapter_sha256: str | None) -> BatchExpectations:
        from lm.chat import encode_prompt

        _run, lease_id, fencing = parse_batch_key(spec.bucket_key)
        system = self.config.grpo.system_prompt
        return BatchExpectations(
            run_id=self.run_id,
            lease_id=str(lease_id),
            fencing=fencing,
            worker_id=str(spec.worker_id),
            adapter_version=spec.version,
            adapter_sha256=adapter_sha256,
            tokenizer_fingerprint=self.fingerprint,
            prompt_row_ids=list(spec.prompts),
            group_size=spec.group_size,
            vocab_size=len(self.tokenizer),
            max_new_tokens=spec.max_new_tokens,
            sha256=spec.sha256,
            prompt_token_ids={
                row_id: encode_prompt(self.tokenizer, prompt, system)
                for row_id, prompt in spec.prompts.items()
            },
            kind=spec.kind,
        )

    def _read(self, spec: BatchSpec, path: Path) -> RolloutBatchData:
        version = spec.version
        if version in self.adapter_sha256:
            return read_batch(path, self._expectations(spec, self.adapter_sha256[version]))
        # A version published before this learner attached: its sha256 is not known here,
        # so the file's own stamp is taken for that one field (everything else is checked).
        try:
            return read_batch(path, self._expectations(spec, None))
        except BatchRejected as exc:
            if exc.check != "metadata_adapter_sha256":
                raise
        raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"{}")
        stamped = json.loads(raw).get("adapter_sha256")
        return read_batch(path, self._expectations(spec, stamped))

    def _fetch(self, spec: BatchSpec, url: str, batch_id: object) -> RolloutBatchData:
        """Download (sha256 checked) and read the batch with the validating reader."""
        path = self.work_dir / "batches" / f"{batch_id}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.download(url, path, spec.sha256)
        except ChecksumMismatch as exc:
            raise BatchRejected("checksum", str(exc), check="download_sha256") from exc
        except ObjectMissing as exc:  # its prompts are re-queued (an attempt) or dropped
            raise BatchRejected("invalid", str(exc), check="object_missing") from exc
        try:
            return self._read(spec, path)
        finally:
            path.unlink(missing_ok=True)

    def _rewards(
        self, data: RolloutBatchData, rows: dict[int, tuple[Any, dict[str, Any]]]
    ) -> CombinedRewards:
        """The run's rewards on the decoded completions and their rows' reference columns."""
        texts = [
            self.tokenizer.decode(ids, skip_special_tokens=True)
            for ids in data.completion_token_ids
        ]
        prompts = [rows[i][0] for i in data.prompt_row_ids]
        keys = sorted({k for _p, ref in rows.values() for k in ref})
        columns: dict[str, Sequence[Any]] = {
            k: [rows[i][1].get(k) for i in data.prompt_row_ids] for k in keys
        }
        try:
            return self.rewards.score(prompts, texts, columns)
        except RewardBatchFailed as exc:
            raise BatchRejected("reward_error", str(exc), check="reward") from exc

    def load_eval(self, batch: ClaimedEvalBatch) -> tuple[RolloutBatchData, CombinedRewards]:
        """An eval batch validated (no behaviour log-probs, n samples per item) and scored;
        BatchRejected as `load`."""
        spec = BatchSpec(
            bucket_key=batch.bucket_key,
            worker_id=str(batch.worker_id),
            version=batch.version,
            sha256=batch.sha256,
            prompts={p.item_id: p.prompt for p in batch.prompts},
            group_size=batch.n,
            max_new_tokens=batch.max_new_tokens,
            kind="eval",
        )
        data = self._fetch(spec, batch.url, batch.batch_id)
        rows = {p.item_id: (p.prompt, p.reference) for p in batch.prompts}
        return data, self._rewards(data, rows)

    def load(self, batch: ClaimedBatch) -> IntakeResult:
        """Raise BatchRejected (reason checksum / invalid / prompt_mismatch / reward_error) when
        unusable. Safe to call from any thread (rewards run in the child processes' main
        threads); raises RewardPoolClosed when `close()` ran meanwhile (not a rejection)."""
        spec = BatchSpec(
            bucket_key=batch.bucket_key,
            worker_id=str(batch.worker_id),
            version=batch.adapter_version,
            sha256=batch.sha256,
            prompts={p.prompt_row_id: p.prompt for p in batch.prompts},
            group_size=self.config.group_size,
            max_new_tokens=self.config.sampling.max_new_tokens,
        )
        data = self._fetch(spec, batch.url, batch.batch_id)
        groups, per_reward = self._score(batch, data)
        return IntakeResult(batch, data, groups, per_reward)

    def _score(
        self, batch: ClaimedBatch, data: RolloutBatchData
    ) -> tuple[list[Group], dict[str, list[float]]]:
        rows = {p.prompt_row_id: (p.prompt, p.reference) for p in batch.prompts}
        rewards = self._rewards(data, rows)
        g = self.config.group_size
        groups = []
        for start in range(0, data.n_samples, g):
            completions = [
                Completion(
                    data.prompt_token_ids[i],
                    data.completion_token_ids[i],
                    data.behaviour_logprobs[i],
                )
                for i in range(start, start + g)
            ]
            groups.append(Group(completions, rewards.total[start : start + g]))
        return groups, rewards.per_reward
