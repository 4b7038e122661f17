"""The GRPO loss, as docs/architecture/loss.md, "Loss", defines it.
Pure: tensors in, a scalar loss and its metrics out; no model, no I/O."""

from __future__ import annotations

from typing import get_args

import torch

from protocol.run_config import Correction, ImportanceLevel, LossType, loss_combination_errors


def step_normaliser(mask: torch.Tensor, loss_type: LossType) -> float:
    """The normaliser of `loss_type` over the completions in `mask` (B, T): completion tokens
    (`dapo`, `cispo`) or sequences (`grpo`). `dr_grpo`'s depends on the run's token bounds:
    training computes it (learner/data.py `plan_step`) and passes it.

    Compute it once over every completion of an optimizer step (skipped all-equal groups
    included) and pass it to each micro-batch's `grpo_loss` call."""
    if loss_type in ("dapo", "cispo"):
        return float(mask.sum().item())
    if loss_type == "grpo":
        return float(mask.shape[0])
    if loss_type == "dr_grpo":
        raise ValueError("dr_grpo needs the step's normaliser (learner.data.plan_step)")
    raise ValueError(f"unknown loss_type {loss_type!r}")


def grpo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    loss_type: LossType,
    importance_level: ImportanceLevel = "token",
    correction: Correction = "none",
    tis_cap: float = 2.0,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-surrogate GRPO loss against the behaviour policy (PPO-style two-sided clip with
    asymmetric ε as DAPO's "clip-higher"), per token or per sequence (GSPO); or CISPO; optional
    k3 KL to a reference, optional truncated importance sampling.

    Shapes: logp, behaviour_logp, mask, ref_logp (B, T) — per completion token, left-aligned,
    mask 1 on completion tokens (the EOS included) and 0 on padding; advantages (B,).

    The ratio r of token t of sequence i: importance_level "token": ρ_t = exp(logp_t −
    behaviour_logp_t); "sequence" (GSPO): s_i = exp(mean over i's tokens of (logp −
    behaviour_logp)), the same for each of its tokens (its gradient reaches every token of i,
    1/|o_i| each).
      correction="none": ℓ_t = −min(r A_i, clip(r, 1−ε_low, 1+ε_high) A_i)
      correction="tis":  ℓ_t = −sg(min(ρ_t, C)) · A_i · exp(logp_t − sg(logp_t))
                         (value −min(ρ_t, C) A_i; gradient −min(ρ_t, C) A_i ∇logp_t)
      loss_type="cispo": ℓ_t = −sg(clip(ρ_t, 1−ε_low, 1+ε_high)) · A_i · logp_t
                         (ε_low ≥ 1: no lower clip)
      β > 0:             ℓ_t += β · (exp(ref_t − logp_t) − (ref_t − logp_t) − 1)   (k3)
    Combinations that `protocol.run_config.loss_combination_errors` refuses raise ValueError.
    Aggregation:
      dapo, cispo: Σ_{i,t} ℓ_t / normaliser, default normaliser = this call's completion tokens
      grpo:    Σ_i (Σ_t ℓ_t / |o_i|) / normaliser, default normaliser = this call's sequences
      dr_grpo: Σ_{i,t} ℓ_t / normaliser, no default (learner/data.py `plan_step` computes it)
    Micro-batches of one optimizer step pass the step's normaliser (`step_normaliser`), so
    their losses (and gradients) sum to the full step's (a sequence is never split).

    Metrics (floats, over this call's completion tokens, each token counted with the ratio r its
    loss uses): ratio_mean/min/max of r; clip_low, clip_high: share of tokens whose ratio was
    clipped — clipped surrogate: r < 1−ε_low and A < 0, r > 1+ε_high and A > 0 (GSPO: the
    tokens of the sequences clipped); cispo: ρ < 1−ε_low, ρ > 1+ε_high, whatever A's sign;
    kl_behaviour (k3 estimate of KL(behaviour‖current) per token, i.e. mean of ρ − 1 − log ρ);
    kl_ref when β > 0; tokens (count). Empty calls (no tokens) report NaN ratios.
    """
    if logp.shape != behaviour_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"shape mismatch: {logp.shape}, {behaviour_logp.shape}, {mask.shape}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,), got {tuple(advantages.shape)}")
    _check_options(loss_type, importance_level, correction, epsilon_low)
    m = mask.to(logp.dtype)  # (B, T)
    adv = advantages.to(logp.dtype).unsqueeze(1)  # (B, 1)
    log_ratio = torch.where(m.bool(), logp - behaviour_logp, 0.0)  # (B, T)
    ratio = _ratio(log_ratio, m, importance_level)  # (B, T)
    lo, hi = 1.0 - epsilon_low, 1.0 + epsilon_high
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, lo, hi).detach() * adv * logp
        clip_low, clip_high = ratio < lo, ratio > hi
    else:
        clip_low, clip_high = (ratio < lo) & (adv < 0), (ratio > hi) & (adv > 0)
        if correction == "tis":
            weight = torch.clamp(ratio, max=tis_cap).detach()
            per_token = -weight * adv * torch.exp(logp - logp.detach())
        else:
            per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, lo, hi) * adv)
    kl_ref: torch.Tensor | None = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp")
        diff = ref_logp - logp
        kl_ref = torch.exp(diff) - diff - 1.0  # (B, T), k3
        per_token = per_token + beta * kl_ref
    per_token = per_token * m
    if normaliser is None:
        normaliser = step_normaliser(m, loss_type)
    if loss_type == "grpo":
        lengths = m.sum(dim=1).clamp(min=1.0)  # (B,)
        total = (per_token.sum(dim=1) / lengths).sum()
    elif loss_type in ("dapo", "dr_grpo", "cispo"):
        total = per_token.sum()
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")
    loss = total / max(float(normaliser), 1e-12)
    return loss, _metrics(ratio, log_ratio, clip_low, clip_high, m, kl_ref)


def _check_options(
    loss_type: str, importance_level: str, correction: str, epsilon_low: float
) -> None:
    if importance_level not in get_args(ImportanceLevel):
        raise ValueError(f"unknown importance_level {importance_level!r}")
    if correction not in get_args(Correction):
        raise ValueError(f"unknown correction {correction!r}")
    refused = loss_combination_errors(loss_type, importance_level, correction, epsilon_low)
    if refused:
        raise ValueError("; ".join(message for _field, message in refused))


def _ratio(log_ratio: torch.Tensor, m: torch.Tensor, importance_level: str) -> torch.Tensor:
    """ρ_t per token, or GSPO's s_i = exp(mean_t log ρ_t) over each sequence's tokens,
    broadcast to them. Rows without a token get s = 1 (and no loss: they are masked)."""
    if importance_level == "token":
        return torch.exp(log_ratio)
    lengths = m.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
    return torch.exp(log_ratio.sum(dim=1, keepdim=True) / lengths).expand_as(log_ratio)


def _metrics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    clip_low: torch.Tensor,
    clip_high: torch.Tensor,
    m: torch.Tensor,
    kl_ref: torch.Tensor | None,
) -> dict[str, float]:
    with torch.no_grad():
        n = float(m.sum().item())
        sel = m.bool()
        if n == 0:
            nan = float("nan")
            out = {"tokens": 0.0, "ratio_mean": nan, "ratio_min": nan, "ratio_max": nan}
            out.update(clip_low=nan, clip_high=nan, kl_behaviour=nan)
            return out
        r = ratio[sel]
        k3 = (torch.exp(log_ratio) - 1.0 - log_ratio)[sel]
        out = {
            "tokens": n,
            "ratio_mean": float(r.mean().item()),
            "ratio_min": float(r.min().item()),
            "ratio_max": float(r.max().item()),
            "clip_low": (clip_low & sel).sum().item() / n,
            "clip_high": (clip_high & sel).sum().item() / n,
            "kl_behaviour": float(k3.mean().item()),
        }
        if kl_ref is not None:
            out["kl_ref"] = float(kl_ref[sel].mean().item())
        return out


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Combine the metrics of one step's micro-batches: token-weighted means, min of mins,
    max of maxes."""
    parts = [p for p in parts if p.get("tokens", 0.0) > 0]
    if not parts:
        return {}
    n = sum(p["tokens"] for p in parts)
    out = {"tokens": n}
    for key in ("ratio_mean", "clip_low", "clip_high", "kl_behaviour", "kl_ref", "entropy"):
        if all(key in p for p in parts):
            out[key] = sum(p[key] * p["tokens"] for p in parts) / n
    out["ratio_min"] = min(p["ratio_min"] for p in parts)
    out["ratio_max"] = max(p["ratio_max"] for p in parts)
    return out
