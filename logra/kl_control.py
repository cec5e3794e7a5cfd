"""Predicted-KL step control: scale each proposed step so the policy moves by about δ.

Works with any update rule that can `propose()` a step and evaluate the model at θ + η·step
(`rule.perturbed(step, eta)`), i.e. LoGRA and dense Adam.

The probe is a few sequences of the current rollout batch, split in two halves (`split_probe`):
the prediction is made on the first, the realized KL is measured on the second, so that the
calibration (realized / predicted) is measured on sequences the prediction did not see. Per
update, on their completion tokens:
1. base: π_θ on each half (`probe_base`: one no-grad forward);
2. K₁ = mean over the first half's tokens of KL(π_θ ‖ π_{θ+Δ}), from one forward with the step
   added (LoGRA: low-rank side branches on the Linear outputs, no weight copy);
3. η = min(η_max, √(δ / K₁)); the prediction for the applied step is η²·K₁ (KL is quadratic in
   η for small steps);
4. after `apply(step, η)`, the realized KL(π_θ ‖ π_new) on the second half.
Steps 1 (second half) and 4 run for every method, with or without control, so `kl_real` is
always logged.

KL in chunks of tokens: no (sequences, positions, vocabulary) tensor of the probe is ever
whole. The base keeps, per probe token, the input of the output layer (hidden size, not
vocabulary size) and a copy of the output layer's weights if they are trained (they change in
the update; one vocab x hidden matrix, gathered in full under FSDP); each KL forward replaces
the output layer's forward for its duration, so that inside the model's forward (where FSDP
has the weights unsharded) the logits of `chunk_tokens` tokens at a time are formed for both
policies and reduced to their KL, with at most three (chunk, vocabulary) float32 tensors alive.
The output layer must be a plain Linear (no hooks of an update rule on it; LoGRA's default
modules leave it dense).

Option `refine` (off by default): when η < η_max, KL is not exactly quadratic out to η = 1, so
the curvature is re-measured once at the chosen η (η₂ = √(δ·η² / KL(η)), prediction
η₂²·KL(η)/η²). One more probe forward per step; whether the single-shot rule is calibrated is
measured by every run (its summary's `kl.calibration`).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from logra import distributed
from logra.modeling import CHUNK_TOKENS, output_layer_replaced


@dataclass
class ProbeBase:
    """What the probe keeps of π_θ across an update: per completion token the output layer's
    input (N, hidden), and the output layer's weights as they were."""
    hidden: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    temperature: float = 1.0
    chunk_tokens: int = CHUNK_TOKENS

    def split(self, first: tuple) -> tuple[ProbeBase, ProbeBase]:
        """The bases of a probe's two halves (`split_probe`), `first` being the first half:
        its tokens come first; the output layer's weights are shared."""
        n = int(first[2].bool().sum())
        return tuple(ProbeBase(h, self.weight, self.bias, self.temperature, self.chunk_tokens)
                     for h in (self.hidden[:n], self.hidden[n:]))


def split_probe(probe: tuple) -> tuple[tuple, tuple]:
    """(prediction half, held-out half) of a probe (ids, attn, mask), by sequences."""
    n = probe[0].shape[0]
    if n < 2:
        raise ValueError(f"grpo.probe_size: {n} sequence(s) cannot be split into a prediction "
                         "half and a held-out half; give at least 2")
    return tuple(t[:n // 2] for t in probe), tuple(t[n // 2:] for t in probe)


def _forward(model, ids, attn):
    position_ids = (attn.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=attn, position_ids=position_ids)


def probe_base(model, probe: tuple, temperature: float = 1.0,
               chunk_tokens: int | None = None) -> ProbeBase:
    """π_θ on `probe` = (ids, attn, mask): the output layer's inputs at the positions whose next
    token is a completion token, and its weights (copied when trained, or sharded).
    `chunk_tokens` (None: CHUNK_TOKENS) sizes the chunks of every KL against this base."""
    ids, attn, mask = probe
    out = {}

    def keep(x, weight, bias):
        copy = weight.requires_grad or distributed.world_size() > 1
        out["base"] = ProbeBase(
            x[:, :-1][mask.bool()].detach().clone(), weight.detach().clone() if copy else weight,
            None if bias is None else bias.detach().clone(), temperature,
            chunk_tokens or CHUNK_TOKENS)

    with output_layer_replaced(model, keep):
        _forward(model, ids, attn)
    return out["base"]


def _logprobs(hidden, weight, bias, temperature):
    logits = F.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits.div_(temperature)
    return torch.log_softmax(logits, dim=-1)


def probe_kl(model, base: ProbeBase, probe: tuple) -> float:
    """Mean over `probe`'s completion tokens of KL(π_base ‖ π_model), formed in chunks of
    `base.chunk_tokens` tokens (rank 0's value under FSDP, so every rank decides alike)."""
    ids, attn, mask = probe
    total = torch.zeros((), dtype=torch.float64, device=ids.device)

    def kl(x, weight, bias):
        nonlocal total
        hidden = x[:, :-1][mask.bool()]
        for i in range(0, hidden.shape[0], base.chunk_tokens):
            c = slice(i, i + base.chunk_tokens)
            before = _logprobs(base.hidden[c], base.weight, base.bias, base.temperature)
            after = _logprobs(hidden[c], weight, bias, base.temperature)
            after.neg_().add_(before).mul_(before.exp_())  # p·(log p - log q), in place
            total = total + after.sum(-1).double().sum()
            del before, after  # before the next chunk's are formed

    with output_layer_replaced(model, kl):
        _forward(model, ids, attn)
    value = (total / max(base.hidden.shape[0], 1)).item()
    return distributed.broadcast(value)


class KLControl:
    def __init__(self, target: float, eta_max: float = 1.0, refine: bool = False):
        if target <= 0:
            raise ValueError(f"kl_control.target must be > 0, got {target}")
        self.target, self.eta_max, self.refine = target, eta_max, refine

    def scale(self, model, rule, step, probe: tuple, base: ProbeBase,
              max_scale: float = 1.0) -> tuple[float, float]:
        """(η, predicted KL at η) for `step` on `probe` = (ids, attn, mask) with its `base`;
        η ≤ η_max·max_scale (`max_scale` < 1 during warmup). A non-finite K₁ skips the step
        (η = 0)."""
        eta_max = self.eta_max * max_scale

        def kl_at(eta: float) -> float:
            with rule.perturbed(step, eta):
                return probe_kl(model, base, probe)

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


def calibration(rows: list[dict]) -> dict:
    """Realized / predicted KL over a run's metric rows (predicted on the probe's first half,
    realized on its held-out second half), separately for steps at η = 1 (the prediction is K₁
    itself) and at η < 1 (η²·K₁ extrapolates): steps, median, p10, p90."""
    out = {}
    for key, keep in (("eta_1", lambda eta: eta == 1), ("eta_below_1", lambda eta: eta < 1)):
        ratios = sorted(r["kl_real"] / r["kl_pred"] for r in rows
                        if r["kl_pred"] > 0 and keep(r["step_scale"])
                        and math.isfinite(r["kl_real"]))
        deciles = (statistics.quantiles(ratios, n=10, method="inclusive") if len(ratios) > 1
                   else ratios * 9)
        out[key] = {"steps": len(ratios), "median": statistics.median(ratios) if ratios else None,
                    "p10": deciles[0] if ratios else None, "p90": deciles[-1] if ratios else None}
    return out
