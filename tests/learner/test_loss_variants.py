"""GSPO (importance_level "sequence") and CISPO (loss_type "cispo") against values and gradients
worked out by hand (docs/architecture/loss.md, "Sampling, log-probs and the GRPO loss")."""

from __future__ import annotations

import math

import pytest
import torch

from learner.loss import grpo_loss, merge_metrics, step_normaliser

E = math.exp
# Two sequences of unequal length: seq0 has 3 tokens, seq1 2 tokens and one pad.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, 0.0]], dtype=torch.float64)
PAD = 5.0  # a pad's log-prob far from anything: it would move s1 if it were counted

# GSPO: log-ratios seq0 [0.3, −0.1, 0.1] (mean 0.1), seq1 [−0.4, −0.2] (mean −0.3), so
# s0 = e^0.1 ≈ 1.1052 and s1 = e^−0.3 ≈ 0.7408, each token carrying its sequence's ratio.
SEQ_LOG_RATIO = [[0.3, -0.1, 0.1], [-0.4, -0.2, PAD]]
S0, S1 = E(0.1), E(-0.3)


def _seq_inputs() -> torch.Tensor:
    return (BEHAVIOUR + torch.tensor(SEQ_LOG_RATIO, dtype=torch.float64)).requires_grad_(True)


def _gspo(logp, adv, eps_low=0.2, eps_high=0.28, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("loss_type", "grpo")
    adv_t = torch.tensor(adv, dtype=torch.float64)
    return grpo_loss(
        logp,
        BEHAVIOUR,
        adv_t,
        MASK,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        importance_level="sequence",
        **kw,
    )


# A = [1, −1], ε = 0.2/0.28 (clip to [0.8, 1.28]):
#   seq0: s0 ≈ 1.105 inside the clip → ℓ0 = −s0 per token, gradient −A0 s0/|o0| to each token
#   seq1: s1 ≈ 0.741 < 0.8 with A1 < 0 → clipped low: ℓ1 = −min(−s1, −0.8) = 0.8, no gradient
@pytest.mark.parametrize(
    ("loss_type", "extra", "value", "grad0"),
    [
        # grpo: (mean_t ℓ0 + mean_t ℓ1) / 2; ∂/∂logp0_u = −s0 · (1/3) / 2
        ("grpo", {}, (-S0 + 0.8) / 2, -S0 / 6),
        # dapo: (3ℓ0 + 2ℓ1) / 5 tokens; ∂/∂logp0_u = −s0 · (1/3) · 3 / 5
        ("dapo", {}, (-3 * S0 + 2 * 0.8) / 5, -S0 / 5),
        # dr_grpo: (3ℓ0 + 2ℓ1) / (2 sequences × 4 max tokens)
        ("dr_grpo", {"normaliser": 8.0}, (-3 * S0 + 2 * 0.8) / 8, -S0 * 3 / 3 / 8),
    ],
)
def test_gspo_value_and_gradient_by_hand(loss_type, extra, value, grad0) -> None:  # type: ignore[no-untyped-def]
    logp = _seq_inputs()
    loss, m = _gspo(logp, [1.0, -1.0], loss_type=loss_type, **extra)
    assert loss.item() == pytest.approx(value, abs=1e-12)
    loss.backward()
    want = torch.tensor([[grad0] * 3, [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)
    assert m["clip_low"] == pytest.approx(2 / 5)  # seq1's two tokens
    assert m["clip_high"] == 0.0


def test_gspo_clips_per_sequence_on_both_sides_with_gspo_epsilons() -> None:
    # ε_low 3e-4, ε_high 4e-4 (the GSPO paper's): s0 > 1.0004 with A0 > 0 → clipped high,
    # ℓ0 = −1.0004; s1 < 0.9997 with A1 < 0 → clipped low, ℓ1 = 0.9997. No gradient at all.
    logp = _seq_inputs()
    loss, m = _gspo(logp, [1.0, -1.0], eps_low=3e-4, eps_high=4e-4, loss_type="dapo")
    assert loss.item() == pytest.approx((3 * -1.0004 + 2 * 0.9997) / 5, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.zeros(2, 3, dtype=torch.float64))
    assert m["clip_high"] == pytest.approx(3 / 5)  # the tokens of the clipped sequences
    assert m["clip_low"] == pytest.approx(2 / 5)
    assert m["ratio_mean"] == pytest.approx((3 * S0 + 2 * S1) / 5)  # token-weighted
    assert m["ratio_min"] == pytest.approx(S1)
    assert m["ratio_max"] == pytest.approx(S0)
    # kl_behaviour stays per token: mean of e^x − 1 − x over the 5 log-ratios
    xs = [0.3, -0.1, 0.1, -0.4, -0.2]
    assert m["kl_behaviour"] == pytest.approx(sum(E(x) - 1 - x for x in xs) / 5)
    assert m["tokens"] == 5


def test_gspo_low_ratio_with_positive_advantage_is_not_clipped() -> None:
    # A = [−1, 1]: seq0 s0 > 1 with A < 0 and seq1 s1 < 0.8 with A > 0: the min keeps the
    # unclipped term for both: ℓ0 = s0, ℓ1 = −s1; gradient −A_i s_i / |o_i| per token (grpo /2).
    logp = _seq_inputs()
    loss, m = _gspo(logp, [-1.0, 1.0])
    assert loss.item() == pytest.approx((S0 - S1) / 2, abs=1e-12)
    loss.backward()
    want = torch.tensor([[S0 / 6] * 3, [-S1 / 4, -S1 / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)
    assert m["clip_low"] == 0.0
    assert m["clip_high"] == 0.0


def test_gspo_ignores_padding() -> None:
    base = _seq_inputs()
    moved = base.detach().clone()
    moved[1, 2] = -40.0  # another pad value: nothing may change
    moved.requires_grad_(True)
    behaviour = BEHAVIOUR.clone()
    behaviour[1, 2] = 7.0
    a, ma = _gspo(base, [-1.0, 1.0])
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    b, mb = grpo_loss(
        moved,
        behaviour,
        adv,
        MASK,
        epsilon_low=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        importance_level="sequence",
    )
    a.backward()
    b.backward()
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    torch.testing.assert_close(base.grad, moved.grad)
    assert ma == pytest.approx(mb)


def test_gspo_gradient_equals_the_gspo_token_form() -> None:
    # GSPO-token: s_{i,t} = sg(s_i) · π(t)/sg(π(t)); with one advantage per sequence its value
    # and gradient are GSPO's under every aggregation, so the loss uses the direct form.
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    for loss_type in ("grpo", "dapo"):
        direct_in, token_in = _seq_inputs(), _seq_inputs()
        direct, _ = _gspo(direct_in, [1.0, 1.0], loss_type=loss_type)
        lr = torch.where(MASK.bool(), token_in - BEHAVIOUR, 0.0)
        s = torch.exp(lr.sum(1, keepdim=True) / MASK.sum(1, keepdim=True))
        ratio = s.detach() * torch.exp(token_in - token_in.detach())
        clipped = torch.clamp(ratio, 0.8, 1.28)
        per_token = -torch.minimum(ratio * adv[:, None], clipped * adv[:, None]) * MASK
        if loss_type == "grpo":
            by_hand = (per_token.sum(1) / MASK.sum(1)).sum() / 2
        else:
            by_hand = per_token.sum() / 5
        direct.backward()
        by_hand.backward()
        assert direct.item() == pytest.approx(by_hand.item(), abs=1e-12)
        torch.testing.assert_close(direct_in.grad, token_in.grad)


def test_gspo_with_k3_kl_by_hand() -> None:
    # β = 0.1, ref = behaviour: k3_t = e^{−x_t} + x_t − 1 for log-ratio x_t; grpo averages it
    # per sequence. Surrogate as in the first test (A = [1, −1]).
    logp = _seq_inputs()
    beta = 0.1
    loss, m = _gspo(logp, [1.0, -1.0], ref_logp=BEHAVIOUR, beta=beta)
    k3 = [[E(-x) + x - 1 for x in row] for row in ([0.3, -0.1, 0.1], [-0.4, -0.2])]
    seq0 = -S0 + beta * sum(k3[0]) / 3
    seq1 = 0.8 + beta * sum(k3[1]) / 2
    assert loss.item() == pytest.approx((seq0 + seq1) / 2, abs=1e-12)
    assert m["kl_ref"] == pytest.approx((sum(k3[0]) + sum(k3[1])) / 5)
    loss.backward()
    # ∂k3/∂logp = 1 − e^{−x}
    g0 = [-S0 / 6 + beta * (1 - E(-x)) / 3 / 2 for x in (0.3, -0.1, 0.1)]
    g1 = [beta * (1 - E(-x)) / 2 / 2 for x in (-0.4, -0.2)]
    torch.testing.assert_close(logp.grad, torch.tensor([g0, [*g1, 0.0]], dtype=torch.float64))


def test_gspo_row_without_tokens_adds_nothing() -> None:
    logp = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, 5.0], dtype=torch.float64)
    loss, m = grpo_loss(
        logp, torch.zeros(2, 2, dtype=torch.float64), adv, mask, epsilon_low=0.2,
        epsilon_high=0.28, loss_type="grpo", importance_level="sequence", normaliser=1.0,
    )  # fmt: skip
    # seq0 on-policy: s0 = 1, ℓ0 = −1; the empty row adds nothing and stays finite
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5, -0.5], [0.0, 0.0]]).double())
    assert m["tokens"] == 2


# CISPO: ratios seq0 ρ = [1.5, 0.5, 1.1], seq1 ρ = [0.7, 1.3] (and a pad); log-probs chosen:
CISPO_LOGP = [[-0.5, -1.0, -2.0], [-0.25, -1.5, PAD]]
RHO = [[1.5, 0.5, 1.1], [0.7, 1.3, 1.0]]
CISPO_ADV = torch.tensor([2.0, -1.0], dtype=torch.float64)


def _cispo(eps_low: float, eps_high: float = 0.28, **kw):  # type: ignore[no-untyped-def]
    logp = torch.tensor(CISPO_LOGP, dtype=torch.float64, requires_grad=True)
    behaviour = logp.detach() - torch.log(torch.tensor(RHO, dtype=torch.float64))
    loss, m = grpo_loss(
        logp,
        behaviour,
        CISPO_ADV,
        MASK,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        loss_type="cispo",
        **kw,
    )
    loss.backward()
    return loss, m, logp.grad


def test_cispo_value_and_gradient_by_hand() -> None:
    # weights clip(ρ, 0.8, 1.28): seq0 [1.28, 0.8, 1.1], seq1 [0.8, 1.28]; ℓ = −w·A·logp:
    #   seq0 (A=2):  1.28, 1.6, 4.4      seq1 (A=−1): −0.2, −1.92     Σ = 5.16 over 5 tokens
    # gradient −w·A / 5 (the weight is a constant): seq0 [−0.512, −0.32, −0.44], seq1 [0.16, 0.256]
    loss, m, grad = _cispo(0.2)
    assert loss.item() == pytest.approx(5.16 / 5, abs=1e-12)
    want = torch.tensor([[-0.512, -0.32, -0.44], [0.16, 0.256, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, want)
    # clipped weights whatever A's sign: low seq0 t1 (A>0) and seq1 t0 (A<0); high seq0 t0, seq1 t1
    assert m["clip_low"] == pytest.approx(2 / 5)
    assert m["clip_high"] == pytest.approx(2 / 5)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.7 + 1.3) / 5)
    assert (m["ratio_min"], m["ratio_max"]) == (pytest.approx(0.5), pytest.approx(1.5))
    assert step_normaliser(MASK, "cispo") == 5.0


@pytest.mark.parametrize("eps_low", [1.0, 5.0])
def test_cispo_epsilon_low_at_least_one_clips_from_above_only(eps_low: float) -> None:
    # weights min(ρ, 1.28): seq0 [1.28, 0.5, 1.1], seq1 [0.7, 1.28]
    #   ℓ: seq0 1.28, 1.0, 4.4; seq1 −0.175, −1.92; Σ = 4.585 over 5 tokens
    loss, m, grad = _cispo(eps_low)
    assert loss.item() == pytest.approx(4.585 / 5, abs=1e-12)
    want = torch.tensor([[-0.512, -0.2, -0.44], [0.14, 0.256, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, want)
    assert m["clip_low"] == 0.0
    assert m["clip_high"] == pytest.approx(2 / 5)


def test_cispo_with_k3_kl_by_hand() -> None:
    # ref = 0: k3 = e^{−logp} + logp − 1, added per token, then Σ / 5 as for the surrogate
    beta = 0.1
    ref = torch.zeros(2, 3, dtype=torch.float64)
    loss, m, grad = _cispo(0.2, ref_logp=ref, beta=beta)
    lps = [-0.5, -1.0, -2.0, -0.25, -1.5]
    k3 = [E(-x) + x - 1 for x in lps]
    assert loss.item() == pytest.approx((5.16 + beta * sum(k3)) / 5, abs=1e-12)
    assert m["kl_ref"] == pytest.approx(sum(k3) / 5)
    dk3 = [beta * (1 - E(-x)) / 5 for x in lps]  # ∂k3/∂logp = 1 − e^{−logp}
    surrogate = [-0.512, -0.32, -0.44, 0.16, 0.256]
    g = [s + d for s, d in zip(surrogate, dk3, strict=True)]
    torch.testing.assert_close(grad, torch.tensor([g[:3], [*g[3:], 0.0]], dtype=torch.float64))


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"loss_type": "grpo", "epsilon_low": 1.0}, "epsilon_low must be in [0, 1)"),
        ({"loss_type": "cispo", "correction": "tis"}, "correction 'tis'"),
        ({"loss_type": "cispo", "importance_level": "sequence"}, "importance_level 'sequence'"),
        ({"loss_type": "dapo", "importance_level": "sequence", "correction": "tis"}, "'tis'"),
    ],
)
def test_refused_combinations_raise(options, needle) -> None:  # type: ignore[no-untyped-def]
    kw = {"epsilon_low": 0.2, **options}
    with pytest.raises(ValueError) as info:
        grpo_loss(
            torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), MASK.float(), epsilon_high=0.28,
            **kw,
        )  # fmt: skip
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"loss_type": "grpo", "importance_level": "sequence"},
        {"loss_type": "dapo", "importance_level": "sequence"},
        {"loss_type": "dr_grpo", "importance_level": "sequence"},
        {"loss_type": "cispo", "epsilon_low": 1.0},
        {"loss_type": "cispo", "epsilon_low": 0.2},
    ],
)
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_micro_batches_sum_to_the_full_batch(options, beta) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    b, t = 6, 5
    logp0 = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    behaviour = logp0 + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    ref = logp0 + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()
    opts = {"epsilon_low": 0.2, "epsilon_high": 0.28, "beta": beta}
    opts.update(options)
    # dr_grpo has no default normaliser: plan_step's (sequences × max tokens, here b × t)
    given = {"normaliser": float(b * t)} if opts["loss_type"] == "dr_grpo" else {}
    full_in = logp0.clone().requires_grad_(True)
    full, full_m = grpo_loss(full_in, behaviour, adv, mask, ref_logp=ref, **opts, **given)  # type: ignore[arg-type]
    full.backward()
    norm = given["normaliser"] if given else step_normaliser(mask, opts["loss_type"])  # type: ignore[arg-type]
    micro_in = logp0.clone().requires_grad_(True)
    total, parts = 0.0, []
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part, pm = grpo_loss(
            micro_in[sl], behaviour[sl], adv[sl], mask[sl], ref_logp=ref[sl], normaliser=norm,
            **opts,  # type: ignore[arg-type]
        )  # fmt: skip
        part.backward()
        total += part.item()
        parts.append(pm)
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(micro_in.grad, full_in.grad)
    merged = merge_metrics(parts)
    for key in ("tokens", "ratio_mean", "ratio_min", "ratio_max", "clip_low", "clip_high"):
        assert merged[key] == pytest.approx(full_m[key])
    assert 0.0 < merged["clip_low"] + merged["clip_high"] < 1.0  # the draw clips some, not all
