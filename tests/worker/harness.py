"""The worker tests' side of the real control plane (the `server` fixture of
tests/harness/fixtures.py: uvicorn in a process, so it can be stopped and restarted, a fresh
Postgres database, a local-folder bucket): a run with a learner attached that publishes adapter
versions, the worker's settings, and a WorkerLoop in a thread."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from learner.publisher import upload_files
from learner.transfers import Retrier
from protocol.client import AsyncGrpoClient
from protocol.schemas_learner import PublishRequest
from tests.harness.runs import LIVE_RUN, create_run, jsonl
from tests.harness.stack import LiveServer
from worker.config import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PROMPT = "You are a helpful assistant."


# The worker tests' run (a layer of tests/harness/runs.py run_config), a 30 s lease TTL.
WORKER_RUN: dict[str, Any] = {**LIVE_RUN, "name": "worker-e2e", "lease_ttl_s": 30.0}


def sum_rows(n: int) -> list[dict[str, Any]]:
    """`What is i + (i + 3)?`, answered with just the number, for i < n."""
    return [
        {"prompt": f"What is {i} + {i + 3}? Answer with just the number.", "answer": str(2 * i + 3)}
        for i in range(n)
    ]


def worker_run(n_prompts: int) -> dict[str, Any]:
    """The layer of a worker test's run of `n_prompts` rows."""
    return {**WORKER_RUN, "dataset": jsonl(sum_rows(n_prompts))}


class Stack:
    """Server + run + attached learner; `publish` makes a new adapter version."""

    def __init__(self, server: LiveServer, fingerprint: str, config: dict[str, Any]) -> None:
        self.server = server
        self.admin = AsyncGrpoClient(server.url, server.admin_token)
        created = create_run(self.admin, config, registration_uses=10)
        self.run_id = created.run_id
        self.learner = AsyncGrpoClient(server.url, created.learner_token)
        self.attach = self.learner.learner_attach(self.run_id, fingerprint)
        assert created.registration_token is not None
        self.registration_token = created.registration_token

    def publish(self, version: int, adapter_dir: Path) -> None:
        """Upload an adapter version folder (+ a checkpoint file) and publish it, through the
        learner's own upload (learner/publisher.py upload_files)."""
        checkpoint = adapter_dir.parent / f"{adapter_dir.name}-checkpoint" / "state.bin"
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.write_bytes(b"resume-state-" + str(version).encode())
        files = [(p, "adapter") for p in sorted(adapter_dir.iterdir())]
        fencing = self.attach.fencing
        published = upload_files(
            Retrier(lambda: None),
            self.learner,
            (self.run_id, fencing, version),
            [*files, (checkpoint, "checkpoint")],
        )
        self.learner.publish_adapter(
            self.run_id,
            PublishRequest(
                fencing=fencing,
                version=version,
                files=published["adapter"],
                checkpoint_files=published["checkpoint"],
                learner_step=version,
            ),
        )

    def lease_rows(self) -> list[Any]:
        return self.server.sql(
            "SELECT id, state, adapter_version, end_reason FROM leases WHERE run_id = :r "
            "ORDER BY fencing",
            r=uuid.UUID(self.run_id),
        )

    def batch_rows(self) -> list[Any]:
        return self.server.sql(
            "SELECT b.id, b.lease_id, b.state, b.bucket_key, b.adapter_version, b.n_samples, "
            "b.reject_reason, b.sha256, l.fencing FROM rollout_batches b "
            "JOIN leases l ON l.id = b.lease_id WHERE b.run_id = :r",
            r=uuid.UUID(self.run_id),
        )

    def batch_prompts(self, batch_id: uuid.UUID) -> list[Any]:
        """(prompt_row_id, prompt) of a batch's rows, as the learner gets them on claim."""
        return self.server.sql(
            "SELECT p.id, d.prompt FROM prompt_rows p JOIN dataset_rows d "
            "ON d.id = p.dataset_row_id WHERE p.batch_id = :b ORDER BY p.id",
            b=batch_id,
        )

    def adapter_sha256(self, version: int) -> str:
        rows = self.server.sql(
            "SELECT sha256 FROM adapter_versions WHERE run_id = :r AND version = :v",
            r=uuid.UUID(self.run_id),
            v=version,
        )
        return str(rows[0].sha256)

    def prompt_states(self) -> dict[str, int]:
        rows = self.server.sql(
            "SELECT state, count(*) FROM prompt_rows WHERE run_id = :r GROUP BY state",
            r=uuid.UUID(self.run_id),
        )
        return {state: int(n) for state, n in rows}

    def close(self) -> None:
        self.admin.close()
        self.learner.close()


def worker_settings(stack: Stack, tmp_path: Path, **overrides: Any) -> WorkerSettings:
    values: dict[str, Any] = {
        "server_url": stack.server.url,
        "registration_token": stack.registration_token,
        "name": "test-worker",
        "token_file": tmp_path / "worker" / "token.json",
        "adapter_cache_dir": tmp_path / "worker" / "adapters",
        "work_dir": tmp_path / "worker" / "batches",
        "num_threads": 1,
        "acquire_wait_s": 0.5,
        "idle_backoff_min_s": 0.2,
        "idle_backoff_max_s": 1.0,
        "retry_max_s": 2.0,
        "http_timeout_s": 5.0,
    }
    values.update(overrides)
    return WorkerSettings(**values)


RUNNING: list[LoopThread] = []


class LoopThread:
    """A WorkerLoop in a thread of the test process (stopped after the test if it fails)."""

    def __init__(self, settings: WorkerSettings, backend: Any) -> None:
        from worker.loop import WorkerLoop
        from worker.prompts import PromptEncoder

        encoder = PromptEncoder(backend.tokenizer)
        self.loop = WorkerLoop(
            settings, backend, fingerprint=encoder.fingerprint(), encoder=encoder
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:  # the test reports it
            self.error = exc

    def start(self) -> LoopThread:
        RUNNING.append(self)
        self.thread.start()
        return self

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "worker loop did not finish"
        assert self.error is None, self.error
