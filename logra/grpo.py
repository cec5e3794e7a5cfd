"""The GRPO objective: group-normalised advantages and the clipped policy loss.

Pure functions on tensors, no model or loop code (that lives in `logra/train.py`).

Conventions follow TRL's GRPOTrainer, with these choices stated:
- Advantages: A_i = (r_i - mean(group)) / (std(group) + eps) with the unbiased std, as TRL;
  `scale=False` gives the Dr.GRPO variant (no division).
- Loss: per-token -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) with ρ = exp(logp - old_logp).
  Aggregation "dapo" (default) averages over every completion token of the *whole batch*, so
  long and short completions weigh per token; "grpo" averages per sequence, then over sequences.
  Under gradient accumulation pass `normalizer` (total tokens, or total sequences for "grpo")
  so that the micro-batch losses add up to the full-batch loss exactly.
- KL to a reference: the k3 estimator exp(ref-logp) - (ref-logp) - 1, used only when beta > 0.
"""
from __future__ import annotations

import torch

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


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
                aggregation: str = "dapo", *, normalizer: float | None = None) -> torch.Tensor:
    """Clipped importance-ratio loss over completion tokens.

    logp, old_logp, mask: (batch, T) per-token log-probs and 0/1 completion mask;
    advantages: (batch,). `normalizer` defaults to this batch's own token count ("dapo") or
    sequence count ("grpo").
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"grpo.aggregation: unknown {aggregation!r}; known: {AGGREGATIONS}")
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv)
    if aggregation == "dapo":
        return (per_token * mask).sum() / (normalizer if normalizer is not None
                                           else mask.sum().clamp(min=1))
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_seq.sum() / (normalizer if normalizer is not None else per_seq.numel())


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref): exp(ref - logp) - (ref - logp) - 1 (≥ 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each next token under the sampling policy (logits / temperature, as the
    rollouts were drawn): (batch, T-1), position t scores input_ids[:, t+1].

    Uses gather - logsumexp rather than a full log_softmax, so only one (B, T, V) tensor
    (the logits) is alive, as large vocabularies require.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids).logits[:, :-1].float() / temperature
    target = input_ids[:, 1:].unsqueeze(-1)
    return (logits.gather(-1, target).squeeze(-1) - torch.logsumexp(logits, dim=-1))
