"""Predicted-KL step control: scale each proposed step so the policy moves by about δ.

Works with any update rule that can `propose()` a step and evaluate the model at θ + η·step
(`rule.perturbed(step, eta)`), i.e. LoGRA and dense Adam.

Per update, on a probe subset of the current rollout batch (its completion tokens):
1. base log-probs of π_θ (full vocabulary, one no-grad forward);
2. K₁ = mean over completion tokens of KL(π_θ ‖ π_{θ+Δ}), from one forward with the step
   added (LoGRA: low-rank side branches on the Linear outputs, no weight copy);
3. η = min(η_max, √(δ / K₁)); the prediction for the applied step is η²·K₁ (KL is quadratic in
   η for small steps);
4. after `apply(step, η)`, the realized KL(π_θ ‖ π_new) on the same probe.
Steps 1 and 4 run for every method, with or without control, so `kl_real` is always logged.

Option `refine` (off by default): when η < η_max, KL is not exactly quadratic out to η = 1, so
the curvature is re-measured once at the chosen η (η₂ = √(δ·η² / KL(η)), prediction
η₂²·KL(η)/η²). One more probe forward per step; on the default runs the single-shot rule already
keeps the median realized/predicted ratio near 1 (see the run summaries' `kl` field).
"""
from __future__ import annotations

import math

import torch

from logra import distributed


def probe_logprobs(model, ids: torch.Tensor, attn: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """Full-vocabulary next-token log-probs (B, T-1, V) of the sampling policy, float32."""
    position_ids = (attn.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
    return torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)


def mean_kl(base: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over masked tokens of KL(base ‖ new) for log-prob tensors (B, T, V)."""
    per_token = (base.exp() * (base - new)).sum(-1)
    return ((per_token * mask).sum() / mask.sum().clamp(min=1)).item()


class KLControl:
    def __init__(self, target: float, eta_max: float = 1.0, refine: bool = False):
        if target <= 0:
            raise ValueError(f"kl_control.target must be > 0, got {target}")
        self.target, self.eta_max, self.refine = target, eta_max, refine

    def scale(self, model, rule, step, probe: tuple, base: torch.Tensor,
              max_scale: float = 1.0, temperature: float = 1.0) -> tuple[float, float]:
        """(η, predicted KL at η) for `step` on `probe` = (ids, attn, mask); η ≤ η_max·max_scale
        (`max_scale` < 1 during warmup). A non-finite K₁ skips the step (η = 0)."""
        ids, attn, mask = probe
        eta_max = self.eta_max * max_scale

        def kl_at(eta: float) -> float:  # rank 0's value under FSDP: every rank decides alike
            with rule.perturbed(step, eta):
                return distributed.broadcast(
                    mean_kl(base, probe_logprobs(model, ids, attn, temperature), mask))

        k1 = kl_at(1.0)
        if not math.isfinite(k1):
            return 0.0, 0.0
        if k1 <= 0:
            return eta_max, 0.0
        eta = min(eta_max, math.sqrt(self.target / k1))
        if self.refine and eta < eta_max:
            k_eta = kl_at(eta) / eta ** 2  # curvature at the chosen scale
            if k_eta > 0:
                eta = min(eta_max, math.sqrt(self.target / k_eta))
                return eta, eta ** 2 * k_eta
        return eta, eta ** 2 * k1
