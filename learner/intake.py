"""Claimed batch → groups ready to train: download with sha256, the validating reader of either
batch format as trajectories (`read_trajectories`, with the learner's own prompt tokenization
for single-turn runs, so mismatches are `prompt_mismatch`), the environment check of format 2
rows (learner/env_check.py: the transcript must re-derive the tokens and tool results, else
`env_mismatch`), rewards on the decoded completions, the transcripts and the rows' reference
columns, scored in child processes (learner/reward_pool.py; a reward that raises or times out
on the batch rejects it `reward_error`).

What rewards receive (TRL's signature, `f(prompts, completions, **columns)`): `completions` is
the model's text: the decoded model tokens (`skip_special_tokens=True`) of each model turn,
turns joined by a newline (a single-turn sample: its completion, exactly as before). Format 2
batches add the keyword columns `transcript` (the messages: dicts with role, content, kind,
name, tool_calls) and `info` (the environment's outcome), unless a reference column has that
name (the dataset's column wins)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq

from learner.data import Completion, Group
from learner.env_check import EnvMismatch, check_trajectory
from learner.reward_pool import RewardBatchFailed, RewardPool
from learner.transfers import ObjectMissing
from lm.chat_turns import TemplateMismatch
from protocol.batch_format import METADATA_KEY
from protocol.batches import (
    BatchExpectations,
    BatchRejected,
    TrajectoryBatch,
    TrajectoryRecord,
    read_trajectories,
)
from protocol.environments import SINGLE_TURN
from protocol.layout import parse_batch_key
from protocol.outbound import PUBLIC_ONLY, OutboundPolicy
from protocol.rewards import BUILTINS_ONLY, CombinedRewards, RewardAllowlist
from protocol.run_config import RunConfig
from protocol.schemas_learner import ClaimedBatch, ClaimedEvalBatch
from protocol.trajectories import Trajectory
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
    data: TrajectoryBatch
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
        environment = self.config.environment
        # Other environments add their own instructions or tools to the prompt: its span is
        # checked against the transcript's prompt messages (learner/env_check.py) instead.
        single = environment.name == SINGLE_TURN
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
            }
            if single
            else None,
            kind=spec.kind,
            environment=environment,
        )

    def _read(self, spec: BatchSpec, path: Path) -> TrajectoryBatch:
        version = spec.version
        if version in self.adapter_sha256:
            return read_trajectories(path, self._expectations(spec, self.adapter_sha256[version]))
        # A version published before this learner attached: its sha256 is not known here,
        # so the file's own stamp is taken for that one field (everything else is checked).
        try:
            return read_trajectories(path, self._expectations(spec, None))
        except BatchRejected as exc:
            if exc.check != "metadata_adapter_sha256":
                raise
        raw = (pq.read_schema(path).metadata or {}).get(METADATA_KEY, b"{}")
        stamped = json.loads(raw).get("adapter_sha256")
        return read_trajectories(path, self._expectations(spec, stamped))

    def _check_environment(self, data: TrajectoryBatch, prompts: dict[int, Any]) -> None:
        """Every format 2 row's transcript re-derives its tokens and tool results, and its
        prompt messages are the row's (an environment may add to the system message);
        BatchRejected `env_mismatch` naming the first row that does not."""
        from lm.chat import chat_messages

        system = self.config.grpo.system_prompt
        for i, row in enumerate(data.rows):
            if row.messages is None:
                continue  # format 1: tokens only, checked by the reader
            where = f"row {i} (prompt {row.prompt_row_id}, sample {row.group_index})"
            try:
                own = chat_messages(prompts[row.prompt_row_id], system)
                _check_prompt_messages(row, own)
                check_trajectory(as_trajectory(row), self.tokenizer, self.config.environment)
            except (EnvMismatch, TemplateMismatch) as exc:
                raise BatchRejected("env_mismatch", f"{where}: {exc}", check="environment") from exc

    def _fetch(self, spec: BatchSpec, url: str, batch_id: object) -> TrajectoryBatch:
        """Download (sha256 checked), read the batch with the validating reader and check its
        environment turns."""
        path = self.work_dir / "batches" / f"{batch_id}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.download(url, path, spec.sha256)
        except ChecksumMismatch as exc:
            raise BatchRejected("checksum", str(exc), check="download_sha256") from exc
        except ObjectMissing as exc:  # its prompts are re-queued (an attempt) or dropped
            raise BatchRejected("invalid", str(exc), check="object_missing") from exc
        try:
            data = self._read(spec, path)
        finally:
            path.unlink(missing_ok=True)
        self._check_environment(data, spec.prompts)
        return data

    def model_text(self, row: TrajectoryRecord) -> str:
        """What `completions` holds for a row: each model turn's decoded tokens (special tokens
        skipped), turns joined by a newline."""
        return "\n".join(
            self.tokenizer.decode(row.token_ids[s.start : s.end], skip_special_tokens=True)
            for s in row.spans
            if s.kind == "model"
        )

    def _rewards(
        self, data: TrajectoryBatch, rows: dict[int, tuple[Any, dict[str, Any]]]
    ) -> CombinedRewards:
        """The run's rewards on the model's text, the transcripts (format 2) and the rows'
        reference columns."""
        texts = [self.model_text(r) for r in data.rows]
        ids = [r.prompt_row_id for r in data.rows]
        prompts = [rows[i][0] for i in ids]
        keys = sorted({k for _p, ref in rows.values() for k in ref})
        columns: dict[str, Sequence[Any]] = {k: [rows[i][1].get(k) for i in ids] for k in keys}
        if data.format_version != 1:
            transcripts = [[m.model_dump(mode="json") for m in r.messages or []] for r in data.rows]
            columns.setdefault("transcript", transcripts)
            columns.setdefault("info", [dict(r.info) for r in data.rows])
        try:
            return self.rewards.score(prompts, texts, columns)
        except RewardBatchFailed as exc:
            raise BatchRejected("reward_error", str(exc), check="reward") from exc

    def load_eval(self, batch: ClaimedEvalBatch) -> tuple[TrajectoryBatch, CombinedRewards]:
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
        """Raise BatchRejected (reason checksum / invalid / prompt_mismatch / env_mismatch /
        reward_error) when unusable. Safe to call from any thread (rewards run in the child
        processes' main threads); raises RewardPoolClosed when `close()` ran meanwhile (not a
        rejection)."""
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
        self, batch: ClaimedBatch, data: TrajectoryBatch
    ) -> tuple[list[Group], dict[str, list[float]]]:
        rows = {p.prompt_row_id: (p.prompt, p.reference) for p in batch.prompts}
        rewards = self._rewards(data, rows)
        g = self.config.group_size
        groups = []
        for start in range(0, data.n_samples, g):
            completions = [Completion.from_trajectory(r) for r in data.rows[start : start + g]]
            groups.append(Group(completions, rewards.total[start : start + g]))
        return groups, rewards.per_reward


def as_trajectory(row: TrajectoryRecord) -> Trajectory:
    """A format 2 row (it has a transcript) as a `Trajectory`."""
    return Trajectory(
        token_ids=row.token_ids,
        loss_mask=row.loss_mask,
        logprobs=row.logprobs,
        spans=row.spans,
        messages=row.messages or [],
        stop_reason=row.stop_reason,  # type: ignore[arg-type]  # the reader checked it
        tool_calls=row.tool_calls,
        tool_errors=row.tool_errors,
        info=row.info,
    )


def _check_prompt_messages(row: TrajectoryRecord, own: list[dict[str, str]]) -> None:
    """The row's prompt messages, as the learner builds them, are the transcript's prompt
    messages, except that an environment may append its instructions to the system message or
    add one (worker/environments/tools.py `with_instructions`)."""
    shown = [(m.role, m.content) for m in row.messages or [] if m.kind == "prompt"]
    want = [(m["role"], m["content"]) for m in own]
    if shown == want:
        return
    if want and want[0][0] == "system":
        head, rest = want[0], want[1:]
        ok = bool(shown) and shown[0][0] == "system" and shown[0][1].startswith(head[1])
    else:
        rest, ok = want, bool(shown) and shown[0][0] == "system"
    if not ok or shown[1:] != rest:
        raise EnvMismatch("the transcript's prompt messages are not the row's prompt")
