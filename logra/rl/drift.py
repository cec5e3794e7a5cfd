"""How far a policy has moved, measured exactly at a snapshot: on a fixed set of held-out
prompts the policy samples its own completions (one per prompt, at the sampling temperature,
untruncated, seeded), and along them, per completion token, the entropy of its next-token
distribution and its KL to the SFT base, each a sum over the whole vocabulary (no sampled
estimate). The stability runs log both at every snapshot (workflow/scripts/stability_eval.py);
the criterion's collapse clause reads the entropy (logra/analysis/stability.py); a study's
test runs log both at their last update (workflow/scripts/study_drift.py, or their curve's last
point where the horizon judges stability), secondary endpoints."""
from __future__ import annotations

import torch

from logra.files import read_jsonl
from logra.optim.kl_control import probe_base, probe_kl
from logra.rl.loop import pad_batch
from logra.rl.rollout import generate_rollouts


def policy_drift(model, base_model, tokenizer, prompts: list[str], *, temperature: float,
                 max_new_tokens: int, seed: int, batch_size: int = 256,
                 chunk_tokens: int | None = None) -> dict:
    """Over `prompts` (`batch_size` at a time, each batch's draws seeded by `seed`): the
    completion tokens sampled by `model`, the mean over them of the exact entropy of `model`'s
    next-token distribution ("entropy", nats) and of KL(π_model ‖ π_base) ("kl_to_base"),
    and their count ("tokens")."""
    entropy = kl = 0.0
    tokens = 0
    with torch.no_grad():
        for i in range(0, len(prompts), batch_size):
            rollouts = generate_rollouts(model, tokenizer, prompts[i:i + batch_size], 1,
                                         max_new_tokens, temperature, seed)
            ids, attn, mask, _ = pad_batch(rollouts, tokenizer.pad_token_id)
            probe = (ids, attn, mask)
            own = probe_base(model, probe, temperature, chunk_tokens)
            n = own.hidden.shape[0]
            entropy += own.entropy_sum()
            kl += probe_kl(base_model, own, probe) * n  # KL(π_model ‖ π_base), mean over n
            tokens += n
    return {"entropy": entropy / tokens if tokens else float("nan"),
            "kl_to_base": kl / tokens if tokens else float("nan"), "tokens": tokens}


def drift_prompts(test: str, n: int) -> list[str]:
    """The fixed prompts a drift is measured on: the first `n` of a task's test split (`test`,
    results/data/<task>/test.jsonl; n: stability.criterion.collapse.prompts); an error naming
    the key and the file where it holds fewer."""
    prompts = [r["prompt"] for r in read_jsonl(test, ["prompt"])][:n]
    if len(prompts) < n:
        raise ValueError(f"stability.criterion.collapse.prompts: {n}, but {test} has "
                         f"{len(prompts)} problems")
    return prompts
