"""The trajectory view of a small batch holding huge transcripts (150 rows of 2 MiB each,
zstd-compressed to a few KB) keeps the server process's memory bounded: only the row shown is
kept, its transcript cut at the view's bound (and the answer says so). Measured on a real
`asyncgrpo server` process, as the peak of its resident size during the request."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from protocol.batch_format import TrajectorySample
from protocol.batches import trajectories_table, write_trajectory_batch
from protocol.trajectories import TranscriptMessage
from server.learner.trajectories import MAX_TRANSCRIPT_BYTES
from tests.conftest import make_settings, mint_token
from tests.harness.serve import peak_rss, reset_peak_rss, serve_in_process
from tests.protocol import trajectory_factory as tf
from tests.server.learner.support import make_run
from tests.server.learner.test_trajectory_sample import ENVIRONMENT, _batch_with

pytestmark = pytest.mark.timeout(240)
ROWS = 150
TRANSCRIPT_CHARS = 2 * 1024 * 1024
MAX_GROWTH_BYTES = 300 * 1000 * 1000


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Both databases (conftest's db_url)."""
    return make_settings(db_url, tmp_path / "bucket")


def _huge_samples() -> list[TrajectorySample]:
    rng = random.Random(5)
    text = "a" * TRANSCRIPT_CHARS  # one string shared by every row: the file is what is big
    samples = []
    for row_id in range(ROWS):
        trajectory = tf.trajectory(row_id, rng, turns=1)
        messages = [
            trajectory.messages[0],
            TranscriptMessage(role="assistant", content=text, kind="model"),
        ]
        samples.append(
            TrajectorySample(row_id, 0, trajectory.model_copy(update={"messages": messages}))
        )
    return samples


def _transcript_json(messages: list[TranscriptMessage]) -> str:
    """The transcript as a batch stores it (JSON of the messages)."""
    return json.dumps([m.model_dump(mode="json") for m in messages], ensure_ascii=False)


def _view(app, settings, tmp_path: Path, path: Path) -> tuple[dict[str, Any], int]:  # type: ignore[no-untyped-def]
    """The last row's view of the batch file at `path`, from a server process, and how much
    that process grew to answer it."""
    run = make_run(app, environment=ENVIRONMENT)
    batch_id = _batch_with(app, run.id, path)
    headers = {"Authorization": f"Bearer {mint_token(app, 'admin', name='rss')}"}
    log = tmp_path / "server.log"
    with serve_in_process(settings.database_url, Path(settings.bucket_url), log) as (base, pid):
        baseline = reset_peak_rss(pid)
        answer = httpx.get(
            f"{base}/api/v1/runs/{run.id}/trajectories/sample",
            params={"batch_id": str(batch_id), "row": ROWS - 1},
            headers=headers,
            timeout=120,
        )
        growth = peak_rss(pid) - baseline
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    assert (body["rows"], body["prompt_row_id"]) == (ROWS, ROWS - 1)
    return body, growth


def test_the_view_of_huge_transcripts_as_workers_write_them_cuts_the_row_shown(
    app, settings, tmp_path: Path
) -> None:
    """The batch writer keeps row groups near 32 MiB decoded: the row's group is decoded, and
    its transcript is cut at the view's bound."""
    path = tmp_path / "huge.parquet"
    write_trajectory_batch(path, tf.make_meta(run_id=str(uuid.uuid4())), _huge_samples())
    assert path.stat().st_size < 1024 * 1024  # 300 MiB of transcripts in a small file
    assert pq.ParquetFile(path).metadata.num_row_groups > 1
    body, growth = _view(app, settings, tmp_path, path)
    assert growth < MAX_GROWTH_BYTES, f"the server grew by {growth / 2**20:.0f} MiB"
    assert body["transcript_truncated"] is True
    stored = _huge_samples()[-1].trajectory.messages
    assert body["transcript_bytes"] == len(_transcript_json(stored).encode())
    assert body["transcript_bytes"] > MAX_TRANSCRIPT_BYTES
    # the prompt message, wholly within the bound, is shown; the cut one is not
    assert [m["content"] for m in body["messages"]] == [f"row {ROWS - 1}"]


def test_huge_transcripts_in_one_row_group_are_not_decoded(app, settings, tmp_path: Path) -> None:
    """A hostile worker writes the 150 rows in one row group (one page holds them all): its
    transcripts are not decoded, and the answer says so; the row's other values are shown."""
    path = tmp_path / "one-group.parquet"
    table = trajectories_table(tf.make_meta(run_id=str(uuid.uuid4())), _huge_samples())
    pq.write_table(table, path, compression="zstd")
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    assert path.stat().st_size < 1024 * 1024
    body, growth = _view(app, settings, tmp_path, path)
    assert growth < MAX_GROWTH_BYTES, f"the server grew by {growth / 2**20:.0f} MiB"
    assert body["transcript_truncated"] is True and body["transcript_bytes"] is None
    assert body["messages"] == []
    assert body["stop_reason"] == "done" and body["total_tokens"] > 0
