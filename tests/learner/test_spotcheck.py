from __future__ import annotations

import math

import pytest

from learner.spotcheck import compare_logprobs, far_outside


def test_compare_by_hand() -> None:
    reported = [[-1.0, -2.0], [-0.5]]
    recomputed = [[-1.1, -2.0], [-0.2]]
    r = compare_logprobs(reported, recomputed)
    assert r.n_tokens == 3
    assert r.mean_abs_diff == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert r.max_abs_diff == pytest.approx(0.3)
    k3 = [math.exp(d) - 1 - d for d in (-0.1, 0.0, 0.3)]
    assert r.kl == pytest.approx(sum(k3) / 3)
    assert far_outside(r, threshold=0.01, factor=10.0)  # 0.133 > 0.1
    assert not far_outside(r, threshold=0.05, factor=10.0)


def test_length_mismatch_is_refused() -> None:
    with pytest.raises(ValueError):
        compare_logprobs([[-1.0]], [[-1.0, -2.0]])
