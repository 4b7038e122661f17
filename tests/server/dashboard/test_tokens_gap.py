"""A learner step without `tokens_per_s` (it trained nothing: every group had equal rewards)
is a gap in the tokens/s chart, not a 0 or a spike, and the run page's figure reads "—"."""

from __future__ import annotations

from server.dashboard.service import learner_charts


def test_a_step_without_tokens_per_s_is_a_gap() -> None:
    points = [
        (1, 1, {"reward_mean": 0.5, "tokens_per_s": 35.0}),
        (2, 2, {"reward_mean": 1.0, "trained_tokens": 0.0}),
        (3, 3, {"reward_mean": 0.25, "tokens_per_s": 37.5}),
    ]
    steps, tokens = learner_charts(points)["tokens"]
    assert steps == [1, 2, 3] and tokens == [35.0, None, 37.5]
