"""grpo_loss against values worked out by hand (docs/architecture/loss.md, "Sampling, log-probs and
the GRPO loss", explicit arithmetic)."""

from __future__ import annotations

import math

import pytest
import torch

from learner.loss import grpo_loss, merge_metrics, step_normaliser

EPS_LOW, EPS_HIGH = 0.2, 0.28
# Behaviour log-probs 0, current log-probs ln ρ: ratios seq0 = [1.5, 0.5], seq1 = [0.5, pad].
RATIOS = [[1.5, 0.5], [0.5, 1.0]]
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log(torch.tensor(RATIOS, dtype=torch.float64)).requires_grad_(True)
    return logp, torch.zeros(2, 2, dtype=torch.float64)


def _loss(logp, behaviour, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("loss_type", "dapo")
    return grpo_loss(logp, behaviour, ADV, MASK, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, **kw)


# Per-token losses by hand, ℓ = −min(ρA, clip(ρ, 0.8, 1.28)A):
#   seq0 t0: ρ=1.5, A=1  → −min(1.5, 1.28) = −1.28 (clipped high: no gradient)
#   seq0 t1: ρ=0.5, A=1  → −min(0.5, 0.8)  = −0.5  (unclipped: ∂ℓ/∂logp = −ρA = −0.5)
#   seq1 t0: ρ=0.5, A=−2 → −min(−1.0, −1.6) = 1.6  (clipped low: no gradient)
L00, L01, L10 = -1.28, -0.5, 1.6


@pytest.mark.parametrize(
    ("loss_type", "kw", "expected", "norm"),
    [
        ("dapo", {}, (L00 + L01 + L10) / 3, 3.0),
        ("grpo", {}, ((L00 + L01) / 2 + L10 / 1) / 2, None),
        # dr_grpo: the step's normaliser from plan_step (2 sequences × 4 max tokens here)
        ("dr_grpo", {"normaliser": 8.0}, (L00 + L01 + L10) / (2 * 4), None),
    ],
)
def test_clipped_surrogate_by_hand(loss_type, kw, expected, norm) -> None:  # type: ignore[no-untyped-def]
    logp, behaviour = _inputs()
    loss, metrics = _loss(logp, behaviour, loss_type=loss_type, **kw)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss.backward()
    assert logp.grad is not None
    # Only seq0 t1 is unclipped; its per-token gradient −0.5 goes through the aggregation.
    scale = {"dapo": 1 / 3, "grpo": (1 / 2) / 2, "dr_grpo": 1 / 8}[loss_type]
    want = torch.tensor([[0.0, -0.5 * scale], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)
    if norm is not None:
        assert step_normaliser(MASK, loss_type) == norm


def test_metrics_by_hand() -> None:
    logp, behaviour = _inputs()
    _, m = _loss(logp, behaviour)
    assert m["tokens"] == 3
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5) / 3)
    assert m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(1.5)
    assert m["clip_low"] == pytest.approx(1 / 3)  # seq1 t0: ρ < 0.8 and A < 0
    assert m["clip_high"] == pytest.approx(1 / 3)  # seq0 t0: ρ > 1.28 and A > 0
    k3 = [(1.5 - 1 - math.log(1.5)), (0.5 - 1 - math.log(0.5)), (0.5 - 1 - math.log(0.5))]
    assert m["kl_behaviour"] == pytest.approx(sum(k3) / 3)


def test_tis_value_and_gradient_by_hand() -> None:
    logp, behaviour = _inputs()
    loss, _ = _loss(logp, behaviour, correction="tis", tis_cap=1.2)
    # weights min(ρ, 1.2) = 1.2, 0.5 | 0.5; ℓ = −w·A = −1.2, −0.5 | +1.0
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.0) / 3, abs=1e-12)
    loss.backward()
    # gradient = −min(ρ, C)·A ∇logp (the weight is a constant: no ρ in the derivative)
    want = torch.tensor([[-1.2 / 3, -0.5 / 3], [1.0 / 3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)


def test_k3_kl_term_by_hand() -> None:
    logp, behaviour = _inputs()
    ref = torch.zeros(2, 2, dtype=torch.float64)
    beta = 0.1
    loss, m = _loss(logp, behaviour, ref_logp=ref, beta=beta)
    # k3 with ref = 0: exp(−lnρ) + lnρ − 1 = 1/ρ + lnρ − 1
    k3 = [1 / r + math.log(r) - 1 for r in (1.5, 0.5, 0.5)]
    assert loss.item() == pytest.approx((L00 + L01 + L10 + beta * sum(k3)) / 3, abs=1e-12)
    assert m["kl_ref"] == pytest.approx(sum(k3) / 3)
    loss.backward()
    # ∂k3/∂logp = 1 − 1/ρ; surrogate gradient only at seq0 t1 (−0.5)
    g = [beta * (1 - 1 / 1.5), -0.5 + beta * (1 - 1 / 0.5), beta * (1 - 1 / 0.5)]
    want = torch.tensor([[g[0] / 3, g[1] / 3], [g[2] / 3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)


def test_beta_without_reference_is_refused() -> None:
    logp, behaviour = _inputs()
    with pytest.raises(ValueError, match="ref_logp"):
        _loss(logp, behaviour, beta=0.1)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("correction", ["none", "tis"])
def test_micro_batches_sum_to_the_full_batch(loss_type, correction) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    b, t = 6, 5
    logp0 = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    behaviour = logp0 + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    opts = {
        "epsilon_low": EPS_LOW,
        "epsilon_high": EPS_HIGH,
        "loss_type": loss_type,
        "correction": correction,
    }
    # dr_grpo has no default normaliser: plan_step's (sequences × max tokens, here b × t)
    given = {"normaliser": float(b * t)} if loss_type == "dr_grpo" else {}
    full_in = logp0.clone().requires_grad_(True)
    full, full_m = grpo_loss(full_in, behaviour, adv, mask, **opts, **given)  # type: ignore[arg-type]
    full.backward()
    norm = given["normaliser"] if given else step_normaliser(mask, loss_type)
    micro_in = logp0.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    parts = []
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, pm = grpo_loss(
            micro_in[sl],
            behaviour[sl],
            adv[sl],
            mask[sl],
            normaliser=norm,
            **opts,  # type: ignore[arg-type]
        )
        part.backward()
        total = total + part.detach()
        parts.append(pm)
    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(micro_in.grad, full_in.grad)
    merged = merge_metrics(parts)
    for key in ("tokens", "ratio_mean", "ratio_min", "ratio_max", "clip_low", "clip_high"):
        assert merged[key] == pytest.approx(full_m[key])


def test_dr_grpo_has_no_default_normaliser() -> None:
    """Its normaliser depends on the run's token bounds: only plan_step computes it (an unused
    default, sequences × max_new_tokens, once differed from training's)."""
    logp, behaviour = _inputs()
    with pytest.raises(ValueError, match="plan_step"):
        _loss(logp, behaviour, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="plan_step"):
        step_normaliser(MASK, "dr_grpo")


def test_empty_call_gives_zero_loss() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, m = grpo_loss(
        logp,
        torch.zeros(1, 3),
        torch.ones(1),
        torch.zeros(1, 3),
        epsilon_low=0.2,
        epsilon_high=0.2,
        loss_type="dapo",
        normaliser=5.0,
    )
    assert loss.item() == 0.0
    assert m["tokens"] == 0


def test_merged_entropy_is_the_mean_over_every_micro_batch_token() -> None:
    # 3 tokens at entropy 1.0 and 1 token at 5.0: the step's mean is 2.0, not (1 + 5) / 2.
    parts = [
        {"tokens": 3.0, "entropy": 1.0, "ratio_min": 1.0, "ratio_max": 1.0},
        {"tokens": 1.0, "entropy": 5.0, "ratio_min": 1.0, "ratio_max": 1.0},
        {"tokens": 0.0},  # a micro-batch with no completion token is left out
    ]
    assert merge_metrics(parts)["entropy"] == pytest.approx(2.0)
