"""Predicted-KL step control: scale each proposed step so the policy moves by a set amount.

Two controllers, called by the loop between propose() and apply() with the same signature,
`scale(model, rule, step, probe, base, max_scale, temperature, mismatch) -> (η, predicted KL at
η, diagnostics)`: `KLControl` (config `methods.<name>.kl_control`), this project's, η from the
KL measured at θ + step, for any rule that can evaluate the model at θ + η·step
(`rule.perturbed(step, eta)`); and `BudgetControl`, the LoGRA authors' (`skzhang1/RL`), which a
rule brings as its own (`UpdateRule.control`, LoGRA's): α from a second-order KL prediction by
one forward-mode JVP along the step, against a scheduled budget. The probe is a few sequences of
the current rollout batch, split in two halves (`split_probe`): the prediction is made on the
first, the realized KL is measured on the second (for every method, so `kl_real` is always
logged), each KL in chunks of tokens.

Derivation and details (the steps per update, the chunked KL, `refine`): docs/kl_control.md.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from logra.optim import collectives
from logra.optim.chunked import CHUNK_TOKENS, output_layer_replaced


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

    def entropy_sum(self) -> float:
        """Σ over the kept tokens of the exact entropy of π's next-token distribution at the
        temperature, −Σ_v p·log p over the whole vocabulary (float64 sums, `chunk_tokens`
        tokens at a time)."""
        total = 0.0
        for i in range(0, self.hidden.shape[0], self.chunk_tokens):
            logp = _logprobs(self.hidden[i:i + self.chunk_tokens], self.weight, self.bias,
                             self.temperature)
            total -= (logp.exp() * logp).sum(-1).double().sum().item()
        return total


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
        copy = weight.requires_grad or collectives.world_size() > 1
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
    return collectives.broadcast(value)


def at_cap(control, scale: float, max_scale: float = 1.0) -> bool:
    """Whether `scale` (η, LoGRA's α) is at the control's cap (KLControl's eta_max,
    BudgetControl's alpha_max) times `max_scale`, up to rounding."""
    return scale >= control.cap * max_scale * (1 - 1e-12)


class KLControl:
    """This project's controller: η = min(η_max, √(δ / K₁)), K₁ the KL at θ + step measured
    on the probe's first half (docs/kl_control.md)."""
    needs_base = True  # π_θ on the prediction half (`probe_base`)

    def __init__(self, target: float, eta_max: float = 1.0, refine: bool = False):
        if target <= 0:
            raise ValueError(f"kl_control.target must be > 0, got {target}")
        self.target, self.eta_max, self.refine = target, eta_max, refine
        self.cap = eta_max

    def scale(self, model, rule, step, probe: tuple, base: ProbeBase,
              max_scale: float = 1.0, **_) -> tuple[float, float, dict]:
        """(η, predicted KL at η, {}) for `step` on `probe` = (ids, attn, mask) with its `base`;
        η ≤ η_max·max_scale (`max_scale` < 1 during warmup). A non-finite K₁ skips the step
        (η = 0)."""
        eta_max = self.eta_max * max_scale

        def kl_at(eta: float) -> float:
            with rule.perturbed(step, eta):
                return probe_kl(model, base, probe)

        k1 = kl_at(1.0)
        if not math.isfinite(k1):
            return 0.0, 0.0, {}
        if k1 <= 0:
            return eta_max, 0.0, {}
        eta = min(eta_max, math.sqrt(self.target / k1))
        if self.refine and eta < eta_max:
            k_eta = kl_at(eta) / eta ** 2  # curvature at the chosen scale
            if k_eta > 0:
                eta = min(eta_max, math.sqrt(self.target / k_eta))
                return eta, eta ** 2 * k_eta, {}
        return eta, eta ** 2 * k1, {}


class BudgetControl:
    """The LoGRA authors' controller (`logra_probe.py`), per update k (0-based):
    1. budget = b_f + ½(b₀ − b_f)(1 + cos(π·min(k / (schedule_steps − 1), 1))), b₀ = kl_budget,
       b_f = kl_budget_final;
    2. with `mismatch_subtraction`, when the batch has completion tokens of responses that ended
       with eos: m ← (1 − w)·m + w·max(0, mean(log π_engine − log π_trainer)) over those tokens
       (w = mismatch_ema_weight, m from 0, no bias correction), then
       budget ← max(budget − m, budget·mismatch_budget_floor); otherwise neither changes;
    3. prediction K = mean over the completion tokens of the first `probe_responses` sequences
       (each cut to `probe_max_tokens`) of ½·Var_p(δ), p = softmax(logits / τ) and δ the
       logits' directional derivative along the step at α = 1 over τ: the second-order KL
       of the step, from one forward-mode JVP (`predict_kl`), in eval mode with eager
       attention, float64 sums;
    4. α = min(alpha_max, √(budget / K)), α = 1 for K = 0.
    Deviations: during the harness's warmup α ≤ alpha_max·max_scale; a step without
    directions (non-finite sketch) gets α = 0; the probe sequences are the first of the
    harness's probe half (the other half measures the realized KL), `probe_responses` of them
    in all (the authors probe that many on every data-parallel rank and sum over the ranks:
    under FSDP here every rank probes the same sequences)."""
    needs_base = False

    def __init__(self, kl_budget: float = 2e-4, kl_budget_final: float = 2e-5,
                 schedule_steps: int = 300, alpha_max: float = 3.0, probe_responses: int = 2,
                 probe_max_tokens: int = 4096, mismatch_subtraction: bool = True,
                 mismatch_ema_weight: float = 0.3, mismatch_budget_floor: float = 0.5):
        self.kl_budget, self.kl_budget_final = kl_budget, kl_budget_final
        self.schedule_steps, self.alpha_max = schedule_steps, alpha_max
        self.probe_responses, self.probe_max_tokens = probe_responses, probe_max_tokens
        self.mismatch_subtraction, self.ema_weight = mismatch_subtraction, mismatch_ema_weight
        self.floor = mismatch_budget_floor
        self.mismatch = 0.0  # the EMA
        self.cap = alpha_max

    def budget(self, count: int) -> float:
        """The scheduled budget of update `count` (0-based), before the mismatch."""
        progress = min(count / max(self.schedule_steps - 1, 1), 1.0)
        return self.kl_budget_final + 0.5 * (self.kl_budget - self.kl_budget_final) * (
            1 + math.cos(math.pi * progress))

    def effective_budget(self, count: int, mismatch: float) -> float:
        """Steps 1 and 2 of the class docstring: updates the EMA from `mismatch`, the mean of
        log π_engine − log π_trainer over the completed responses' tokens (nan: none)."""
        budget = self.budget(count)
        if self.mismatch_subtraction and math.isfinite(mismatch):
            observed = max(0.0, mismatch)
            self.mismatch = (1 - self.ema_weight) * self.mismatch + self.ema_weight * observed
            budget = max(budget - self.mismatch, budget * self.floor)
        return budget

    def alpha(self, prediction: float, budget: float, max_scale: float = 1.0) -> float:
        """min(alpha_max·max_scale, √(budget / prediction)), 1 for a zero prediction; a
        non-finite or negative prediction raises FloatingPointError, as the authors' does."""
        if not (math.isfinite(prediction) and prediction >= 0):
            raise FloatingPointError(f"predicted KL {prediction}: not a finite non-negative "
                                     "number (LoGRA's controller)")
        if prediction == 0:
            return min(1.0, self.alpha_max * max_scale)
        return min(self.alpha_max * max_scale, math.sqrt(budget / prediction))

    def scale(self, model, rule, step, probe: tuple, max_scale: float = 1.0,
              temperature: float = 1.0, mismatch: float = math.nan,
              chunk_tokens: int | None = None, **_) -> tuple[float, float, dict]:
        """(α, predicted KL at α, {"kl_budget", "mismatch_ema"}) for `step` of `rule` (which
        provides `tangent(step)` and `count`), predicted on `probe` = (ids, attn, mask)."""
        budget = self.effective_budget(rule.count, mismatch)
        info = {"kl_budget": budget, "mismatch_ema": self.mismatch}
        if step.get("directions") is None:
            return 0.0, math.nan, info
        k = predict_kl(model, rule, step, probe, temperature, self.probe_responses,
                       self.probe_max_tokens, chunk_tokens or CHUNK_TOKENS)
        alpha = self.alpha(k, budget, max_scale)
        return alpha, alpha ** 2 * k, info

    def state_dict(self) -> dict:
        return {"mismatch": self.mismatch}

    def load_state_dict(self, state: dict) -> None:
        self.mismatch = float(state["mismatch"])


@torch.no_grad()
def predict_kl(model, rule, step, probe: tuple, temperature: float, responses: int,
               max_tokens: int, chunk_tokens: int = CHUNK_TOKENS) -> float:
    """Mean over the completion tokens of the first `responses` sequences of `probe` =
    (ids, attn, mask), each cut to its first `max_tokens` tokens, of ½·Σ_v p_v (δ_v − E_p δ)²
    (float64), p = softmax(logits / τ) and δ = the logits' tangent along `rule.tangent(step)`
    over τ: forward-mode JVPs, in eval mode with eager attention (both restored).

    Deviations from the authors' probe (one sequence per forward, logits at every position),
    for time and memory only, the values the same: the logits are formed at the completion
    positions alone (HF's `logits_to_keep`), and sequences share a forward while their kept
    logits stay within `chunk_tokens` rows (a sequence with more has a forward of its own);
    a later token cannot change an earlier position's logits, so the cut at `max_tokens` only
    drops positions."""
    ids, attn, mask = probe
    rows = []  # (sequence, its first token, the positions it predicts a completion token at)
    for i in range(min(responses, ids.shape[0])):
        real = attn[i].nonzero().squeeze(1)
        first = int(real[0]) if len(real) else 0
        where = mask[i].nonzero().squeeze(1)
        rows.append((i, first, where[where < first + max_tokens - 1]))
    groups, group = [], []
    for row in rows:  # consecutive sequences while (sequences x kept positions) <= chunk_tokens
        width = _kept(group + [row]).numel() * (len(group) + 1)
        if group and width > chunk_tokens:
            groups.append(group)
            group = []
        group.append(row)
    groups.append(group)
    total = torch.zeros(2, dtype=torch.float64, device=ids.device)
    was_training, attn_impl = model.training, model.config._attn_implementation
    model.eval()
    model.set_attn_implementation("eager")
    try:
        with rule.tangent(step), fwAD.dual_level():
            for group in groups:
                keep = _kept(group)
                if not len(keep):
                    continue
                index = torch.tensor([i for i, _, _ in group], device=ids.device)
                stop = min(ids.shape[1], max(first + max_tokens for _, first, _ in group))
                att = attn[index, :stop]
                out = model(input_ids=ids[index, :stop], attention_mask=att,
                            position_ids=(att.long().cumsum(-1) - 1).clamp(min=0),
                            use_cache=False, logits_to_keep=keep)
                logits, tangent = fwAD.unpack_dual(out.logits)
                if tangent is None:
                    raise RuntimeError("predict_kl: no tangent reached the logits")
                for j, (_, _, where) in enumerate(group):
                    at = torch.searchsorted(keep, where)
                    for c in torch.split(at, 64):  # in place: 3 (c, V) float64 at a time
                        p = torch.softmax(logits[j, c].double() / temperature, dim=-1)
                        d = tangent[j, c].double().div_(temperature)
                        d.sub_((p * d).sum(-1, keepdim=True)).square_().mul_(p)
                        total[0] += 0.5 * d.sum()
                        total[1] += len(c)
                        del p, d
                del out, logits, tangent
    finally:
        model.set_attn_implementation(attn_impl)
        model.train(was_training)
    if total[1] == 0:
        raise RuntimeError("predict_kl: the probe sequences hold no completion token")
    return collectives.broadcast((total[0] / total[1]).item())


def _kept(rows: list) -> torch.Tensor:
    """The positions any of `rows` predicts at, sorted (the logits a shared forward keeps)."""
    if not rows:
        return torch.zeros(0, dtype=torch.long)
    return torch.unique(torch.cat([where for _, _, where in rows]))


def calibration(rows: list[dict]) -> dict:
    """Realized / predicted KL over a run's metric rows (predicted on the probe's first half,
    realized on its held-out second half), separately for steps at η = 1 (the prediction is K₁
    itself), at η < 1 and at η > 1 (LoGRA's α up to alpha_max; η²·K₁ extrapolates): steps,
    median, p10, p90."""
    out = {}
    for key, keep in (("eta_1", lambda eta: eta == 1), ("eta_below_1", lambda eta: eta < 1),
                      ("eta_above_1", lambda eta: eta > 1)):
        ratios = sorted(r["kl_real"] / r["kl_pred"] for r in rows
                        if r["kl_pred"] > 0 and keep(r["step_scale"])
                        and math.isfinite(r["kl_real"]))
        deciles = (statistics.quantiles(ratios, n=10, method="inclusive") if len(ratios) > 1
                   else ratios * 9)
        out[key] = {"steps": len(ratios), "median": statistics.median(ratios) if ratios else None,
                    "p10": deciles[0] if ratios else None, "p90": deciles[-1] if ratios else None}
    return out
