"""Issue 19 item 5 on the run page: a multi-turn run shows its trajectory charts and the
trajectory view, which renders one row of a real format 2 batch from the store (messages with
their kinds, tool calls, stop reason, which spans were trained); a single-turn run shows none
of it; the charts JSON carries the learner's trajectory figures per version."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from tests.conftest import make_settings
from tests.server.dashboard.test_pages import login
from tests.server.learner.support import attach, make_run
from tests.server.learner.test_trajectory_sample import ENVIRONMENT, _v2_batch

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)


@pytest.fixture
def settings(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Every test here on both databases."""
    return make_settings(db_url, tmp_path / "bucket")


def test_single_turn_run_page_has_no_trajectory_view(app, client, admin_token) -> None:
    run = make_run(app)
    login(client, admin_token)
    page = client.get(f"/runs/{run.id}").text
    assert 'data-chart="trajectories"' not in page and 'id="trajectory"' not in page


def test_trajectory_view_renders_a_real_batch_row(app, client, admin_token, tmp_path) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    batch_id, samples = _v2_batch(app, run.id, tmp_path)
    login(client, admin_token)
    page = client.get(f"/runs/{run.id}").text
    assert 'data-chart="trajectories"' in page and 'data-chart="stops"' in page
    assert f'hx-get="/runs/{run.id}/trajectory"' in page and not INLINE_SCRIPT.search(page)
    want = next(s for s in samples if s.trajectory.tool_calls)  # a row with a tool call
    row = samples.index(want)
    fragment = client.get(
        f"/runs/{run.id}/trajectory", params={"batch_id": str(batch_id), "row": str(row)}
    )
    assert fragment.status_code == 200
    text = html.unescape(fragment.text)
    t = want.trajectory
    kinds = re.findall(r'<li class="msg ([a-z_]+)">', fragment.text)
    assert kinds == [m.kind for m in t.messages]
    assert text.count("<strong>trained</strong>") == sum(m.kind == "model" for m in t.messages)
    spans = re.findall(
        r"<tr><td>([a-z]+)</td><td>(\d+)</td><td>\[(\d+), (\d+)\)</td><td>(yes|no)", text
    )
    assert spans == [
        (
            s.kind,
            str(s.end - s.start),
            str(s.start),
            str(s.end),
            "yes" if s.kind == "model" else "no",
        )
        for s in t.spans
    ]
    assert 'tool call calculator {"expression": "6*7"}' in text
    assert f">{t.stop_reason}<" in text and f"row {row} of {len(samples)}" in text
    # the latest batch by default; bad input answers in place
    assert f"<code>{batch_id}</code>" in client.get(f"/runs/{run.id}/trajectory").text
    assert "is not a UUID" in client.get(f"/runs/{run.id}/trajectory?batch_id=nope").text
    assert "not a row number" in client.get(f"/runs/{run.id}/trajectory?row=-1").text
    outside = client.get(f"/runs/{run.id}/trajectory", params={"row": str(len(samples))}).text
    assert "outside the batch" in outside


def test_trajectory_view_needs_a_login(app, client) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    response = client.get(f"/runs/{run.id}/trajectory", follow_redirects=False)
    assert response.status_code in (302, 303, 401)


def test_charts_carry_trajectory_figures_per_version(app, client, admin_token) -> None:
    run = make_run(app, environment=ENVIRONMENT)
    fencing = attach(client, run)["fencing"]
    points = [
        {
            "step": 1,
            "version": 1,
            "values": {
                "trajectories": 4,
                "turns_mean": 2.0,
                "tool_calls_per_trajectory": 1.0,
                "tool_errors_per_trajectory": 0.5,
                "stop_done": 3,
                "stop_max_turns": 1,
            },
        },
        {
            "step": 2,
            "version": 1,
            "values": {
                "trajectories": 2,
                "turns_mean": 3.0,
                "tool_calls_per_trajectory": 2.0,
                "tool_errors_per_trajectory": 0.0,
                "stop_done": 2,
                "stop_max_turns": 0,
            },
        },
        {"step": 3, "version": 2, "values": {"loss": 0.1}},  # no trajectory figures: no point
    ]
    posted = client.post(
        run.url("metrics"), json={"fencing": fencing, "points": points}, headers=run.headers
    )
    assert posted.status_code == 200, posted.text
    login(client, admin_token)
    charts = client.get(f"/runs/{run.id}/charts.json").json()
    assert charts["trajectories"]["data"] == [[1], [2.5], [1.5], [0.25]]
    stops = dict(zip(charts["stops"]["labels"][1:], charts["stops"]["data"][1:], strict=True))
    assert stops["stopped: done"] == [(3 / 4 + 2 / 2) / 2]
    assert stops["stopped: max_turns"] == [(1 / 4 + 0) / 2] and stops["stopped: length"] == [0.0]


def test_a_transcript_over_the_bound_is_shown_cut_and_said_so(
    app, client, admin_token, tmp_path
) -> None:
    from protocol.batch_format import TrajectorySample
    from protocol.batches import write_trajectory_batch
    from protocol.trajectories import TranscriptMessage
    from server.learner.trajectories import MAX_TRANSCRIPT_BYTES
    from tests.protocol import trajectory_factory as tf
    from tests.server.learner.test_trajectory_sample import _batch_with

    run = make_run(app, environment=ENVIRONMENT)
    trajectory = tf.make_samples(seed=3)[0].trajectory
    long = TranscriptMessage(role="assistant", content="b" * MAX_TRANSCRIPT_BYTES, kind="model")
    cut = trajectory.model_copy(update={"messages": [trajectory.messages[0], long]})
    path = tmp_path / "long.parquet"
    write_trajectory_batch(path, tf.make_meta(run_id=str(run.id)), [TrajectorySample(0, 0, cut)])
    batch_id = _batch_with(app, run.id, path)
    login(client, admin_token)
    fragment = client.get(f"/runs/{run.id}/trajectory", params={"batch_id": str(batch_id)})
    assert fragment.status_code == 200
    assert "over the view&#39;s bound" in fragment.text or "over the view's bound" in fragment.text
    kinds = re.findall(r'<li class="msg ([a-z_]+)">', fragment.text)
    assert kinds == [trajectory.messages[0].kind]  # the cut message is not shown


@pytest.mark.parametrize("row", ["²", "①", "٣", "1_0", "+1", "1e3"])
def test_a_row_that_is_no_ascii_number_is_answered_in_place(app, client, admin_token, row) -> None:  # type: ignore[no-untyped-def]
    """Characters str.isdigit accepts and int() refuses (superscripts, circled digits) were a
    500; other scripts' digits and signs are not row numbers either: the view says so."""
    run = make_run(app, environment=ENVIRONMENT)
    login(client, admin_token)
    fragment = client.get(f"/runs/{run.id}/trajectory", params={"row": row})
    assert fragment.status_code == 200, fragment.text
    assert "is not a row number" in html.unescape(fragment.text)
