"""The policy-gradient objectives, GRPO's and the LoGRA authors' REINFORCE, and the policy's
token log-probs (in chunks of tokens).

No loop code (that lives in `logra/rl/loop.py`).

GRPO's conventions follow TRL's GRPOTrainer (group-normalised advantages, the clipped per-token
loss, aggregation "dapo" by default, the k3 KL to a reference only when beta > 0).
`grpo.estimator: reinforce_baseline` is the LoGRA authors' estimator and loss (`skzhang1/RL`),
one response per prompt: binarised rewards against a running mean of previous batches, no PPO
ratio, a truncated importance weight.

Each convention and stated choice: docs/loop.md, "The objectives".
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from logra.optim.chunked import CHUNK_TOKENS, output_layer_replaced
from logra.rl.settings import Grpo

AGGREGATIONS = ("dapo", "grpo")


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Advantages of `rewards` (flat, groups of `group_size` consecutive completions)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale:
        adv = adv / (r.std(dim=1, keepdim=True) + eps)
    return adv.flatten()


def running_baseline_advantages(rewards: torch.Tensor, lengths: torch.Tensor, baseline: float,
                                weight: float = 0.1, failure_reward: float = -0.01,
                                length_reference: float | None = None
                                ) -> tuple[torch.Tensor, float]:
    """The authors' REINFORCE advantages of `rewards` (one response each, `lengths` its
    completion tokens) against `baseline`, the running mean of earlier batches' outcomes, and
    the baseline after this batch (docs/loop.md)."""
    r = rewards.float()
    outcomes = torch.where(r >= 1.0, 1.0, failure_reward).masked_fill(~torch.isfinite(r),
                                                                      math.nan)
    adv = outcomes - baseline
    if length_reference:
        adv = adv * length_reference / lengths.clamp(min=1)
    valid = lengths > 0
    if valid.any():
        baseline = (1 - weight) * baseline + weight * outcomes[valid].mean().item()
    return adv, baseline


def reinforce_loss(logp: torch.Tensor, engine_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, cap: float = 2.0,
                   aggregation: str = "dapo", *, normalizer: float | None = None
                   ) -> torch.Tensor:
    """−w_t·A·log π per completion token, w_t = min(exp(log π − log π_engine), cap) detached
    (1 without `engine_logp`), aggregated as `policy_loss`. Shapes as `policy_loss`'s."""
    weight = (torch.exp(logp.detach() - engine_logp.to(logp.dtype)).clamp(max=cap)
              if engine_logp is not None else torch.ones_like(logp))
    per_token = -weight * advantages.to(logp.dtype).unsqueeze(1) * logp
    return _aggregate(per_token, mask.to(logp.dtype), aggregation, normalizer)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                aggregation: str = "dapo", *, normalizer: float | None = None) -> torch.Tensor:
    """Clipped importance-ratio loss over completion tokens.

    logp, old_logp, mask: (batch, T) per-token log-probs and 0/1 completion mask;
    advantages: (batch,). `normalizer` defaults to this batch's own token count ("dapo") or
    sequence count ("grpo").
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv)
    return _aggregate(per_token, mask, aggregation, normalizer)


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str,
               normalizer: float | None) -> torch.Tensor:
    """The masked per-token losses as one number (`policy_loss`'s aggregations)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"grpo.aggregation: unknown {aggregation!r}; known: {AGGREGATIONS}")
    if aggregation == "dapo":
        return (per_token * mask).sum() / (normalizer if normalizer is not None
                                           else mask.sum().clamp(min=1))
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum() / (normalizer if normalizer is not None else per_seq.numel())


class GRPO:
    """GRPO's estimator (each estimator: `keys`, the grpo keys it alone reads; `check`,
    `advantages`, `loss`, `has_signal`): advantages normalised within each prompt's group
    (`group_advantages`, grpo.group_size, grpo.scale_advantages) and the clipped-ratio loss
    (`policy_loss`); a step has a gradient when some group's rewards vary."""
    keys = ("scale_advantages", "clip_low", "clip_high")

    def check(self, grpo: Grpo) -> None:
        if grpo.group_size < 2:
            raise ValueError(f"grpo.group_size={grpo.group_size}: GRPO's advantages compare "
                             "the responses of one prompt (at least 2), or set grpo.estimator: "
                             "reinforce_baseline")
        if grpo.length_reference is not None:
            raise ValueError("grpo.length_reference: weighs REINFORCE's advantages; set "
                             "grpo.estimator: reinforce_baseline or drop it")

    def advantages(self, rewards, lengths, baseline: float, grpo: Grpo):
        """(advantages, the baseline unchanged: GRPO keeps none)."""
        return group_advantages(rewards, grpo.group_size, scale=grpo.scale_advantages), \
            baseline

    def loss(self, logp, engine_logp, advantages, mask, grpo: Grpo, normalizer):
        return policy_loss(logp, logp.detach(), advantages, mask, grpo.clip_low,
                           grpo.clip_high, grpo.aggregation, normalizer=normalizer)

    def has_signal(self, rewards, advantages, grpo: Grpo) -> bool:
        return bool((rewards.view(-1, grpo.group_size).std(dim=1) > 0).any())


class RunningBaselineReinforce:
    """The LoGRA authors' REINFORCE (docs/loop.md): advantages against a running
    baseline of earlier batches (`running_baseline_advantages`; the baseline is the loop's
    state, checkpointed with it) and the importance-weighted loss (`reinforce_loss`); every
    response whose outcome is not the baseline has a gradient."""
    keys = ("baseline_weight", "failure_reward", "importance_cap", "length_reference")

    def check(self, grpo: Grpo) -> None:
        pass

    def advantages(self, rewards, lengths, baseline: float, grpo: Grpo):
        """(advantages, the baseline after this batch)."""
        return running_baseline_advantages(rewards, lengths, baseline, grpo.baseline_weight,
                                           grpo.failure_reward, grpo.length_reference)

    def loss(self, logp, engine_logp, advantages, mask, grpo: Grpo, normalizer):
        return reinforce_loss(logp, engine_logp, advantages, mask, grpo.importance_cap,
                              grpo.aggregation, normalizer=normalizer)

    def has_signal(self, rewards, advantages, grpo: Grpo) -> bool:
        return bool((advantages != 0).any())


ESTIMATORS = {"grpo": GRPO(), "reinforce_baseline": RunningBaselineReinforce()}


def estimator(grpo: Grpo) -> GRPO | RunningBaselineReinforce:
    """The estimator `grpo.estimator` names (its `check(grpo)` raises a ValueError naming
    a grpo key that does not fit it)."""
    return ESTIMATORS[grpo.estimator]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref): exp(ref - logp) - (ref - logp) - 1 (≥ 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, temperature: float = 1.0,
                   chunk_tokens: int | None = None) -> torch.Tensor:
    """Log-prob of each next token under the sampling policy (logits / temperature, as the
    rollouts were drawn): (batch, T-1), position t scores input_ids[:, t+1].

    No (batch, T, vocabulary) tensor is formed: the output layer's forward is replaced
    (`logra.optim.chunked.output_layer_replaced`) by `ChunkedTargetLogprobs`, which forms the logits
    of `chunk_tokens` tokens at a time (None: `logra.optim.chunked.CHUNK_TOKENS`) in forward and
    again in backward. The last position, which scores no token, is computed against token 0 and
    dropped, so that the output layer's input is passed on as the view it is.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    targets = torch.cat([input_ids[:, 1:], input_ids.new_zeros(input_ids.shape[0], 1)], 1)
    out = {}

    def head(x, weight, bias):
        out["logp"] = ChunkedTargetLogprobs.apply(
            x.reshape(-1, x.shape[-1]), weight, bias, targets.reshape(-1), temperature,
            chunk_tokens or CHUNK_TOKENS)

    with output_layer_replaced(model, head):
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return out["logp"].view(input_ids.shape)[:, :-1]


def _logits(hidden, weight, bias, temperature):
    """fp32 logits / temperature of a chunk (a fresh tensor: callers modify it in place)."""
    logits = F.linear(hidden, weight, bias).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


class ChunkedTargetLogprobs(torch.autograd.Function):
    """log softmax(hidden·Wᵀ + b / τ) at each row's target, `chunk` rows at a time.

    Saves the rows (the output layer's input, which a trained output layer saves anyway), the
    targets and each row's logsumexp; backward recomputes each chunk's logits under the forward's
    autocast state and turns them in place into the gradient (onehot(target) - softmax)·g / τ.
    At most one (chunk, vocabulary) fp32 tensor is alive, plus its cast to the weight's dtype
    when that is narrower. The output weight's gradient accumulates across chunks in place, in
    the weight's dtype (as fused chunked cross-entropy kernels do; under autocast that in-place
    product runs in fp32, where autograd's would run in the autocast dtype). The textbook graph
    (full logits, logsumexp, gather) saves one (rows, vocabulary) fp32 tensor and holds about
    four more at the start of its backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk):
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        out = torch.empty_like(lse)
        for i in range(0, hidden.shape[0], chunk):
            c = slice(i, i + chunk)
            logits = _logits(hidden[c], weight, bias, temperature)
            top = logits.amax(-1, keepdim=True)
            target = logits.gather(1, targets[c, None]).squeeze(1)
            lse[c] = logits.sub_(top).exp_().sum(-1).log_().add_(top.squeeze(1))
            out[c] = target - lse[c]
            del logits
        device = hidden.device.type
        ctx.autocast = dict(device_type=device, enabled=torch.is_autocast_enabled(device),
                            dtype=torch.get_autocast_dtype(device))
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        g = grad.float() / ctx.temperature
        with torch.autocast(**ctx.autocast):
            for i in range(0, hidden.shape[0], ctx.chunk):
                c = slice(i, i + ctx.chunk)
                d = _logits(hidden[c], weight, bias, ctx.temperature)
                d.sub_(lse[c, None]).exp_().mul_(-g[c, None])  # -softmax·g/τ
                d.scatter_add_(1, targets[c, None], g[c, None])
                d = d.to(weight.dtype)
                if need_h:
                    grad_h[c] = d @ weight
                if need_w:  # in place, in the weight's dtype (see the class docstring)
                    grad_w.addmm_(d.T, hidden[c])
                if need_b:
                    grad_b += d.sum(0)
                del d
        return grad_h, grad_w, grad_b, None, None, None
