"""Warm start: supervised fine-tuning of the base model on a task's train split.

RL needs a policy that is right sometimes: with zero accuracy every group's rewards are equal
and GRPO's advantages vanish; with full accuracy there is nothing to learn. So SFT trains on
`prompt + target + <eos>` (loss on the target and eos only) for `steps` steps, a fixed
schedule: the lr warms up, then (the workflow's default) decays by a cosine to 0 at the last
step, so the base is the end of a converging run, not a point on a curve still climbing (a
constant lr left arithmetic's bases anywhere on its jump from 0.1 to 0.6). Greedy accuracy on
a held-out slice of the train split is logged every `eval_every` steps, the curve that shows
a jump. `stop_at_accuracy` stops as soon as that accuracy reaches it instead: a threshold stop
lands on very different bases when accuracy jumps between two checks, so the workflow's
default is the fixed schedule. The test split is never seen.
"""
from __future__ import annotations

import random

import torch
from tqdm import tqdm

from logra.common import warmup_cosine
from logra.rl.rollout import generate_rollouts


def greedy_accuracy(model, tokenizer, task, examples, max_new_tokens: int) -> float:
    """Fraction of `examples` whose greedy completion gets reward 1."""
    model.eval()
    rollouts = generate_rollouts(model, tokenizer, [ex["prompt"] for ex in examples], 1,
                         max_new_tokens, 0.0, 0)
    model.train()
    return sum(task.reward(r.text, ex) for r, ex in zip(rollouts, examples)) / len(examples)


def sft(model, tokenizer, task, rows: list[dict], *, steps: int, batch_size: int, lr: float,
        stop_at_accuracy: float | None, eval_every: int, eval_examples: int, max_new_tokens: int,
        seed: int, warmup_steps: int, decay: str, decay_final: float) -> dict:
    """Train in place; returns {"steps": n, "accuracy": held-out greedy accuracy, "history"}.
    The lr warms up linearly over `warmup_steps`, then stays (decay "none") or follows a cosine
    to `decay_final` x lr at the last step (decay "cosine"; `logra.common.warmup_cosine`)."""
    if decay not in ("none", "cosine"):
        raise ValueError(f"sft decay must be 'none' or 'cosine', got {decay!r}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows = list(rows)
    rng.shuffle(rows)
    held_out, rows = rows[:eval_examples], rows[eval_examples:]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    decay_steps = steps if decay == "cosine" else 0
    sched = torch.optim.lr_scheduler.LambdaLR(  # LambdaLR counts from 0, the schedule from 1
        opt, lambda s: warmup_cosine(s + 1, warmup_steps, decay_steps, decay_final))
    model.train()
    history, acc, step = [], 0.0, 0
    for step in tqdm(range(1, steps + 1), desc="sft", mininterval=5):
        batch = rng.sample(rows, batch_size)
        prompts = [tokenizer(ex["prompt"])["input_ids"] for ex in batch]
        targets = [tokenizer(task.target(ex))["input_ids"] + [tokenizer.eos_token_id]
                   for ex in batch]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((batch_size, width), tokenizer.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (p, t) in enumerate(zip(prompts, targets)):  # right padding
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
            attn[i, :len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % eval_every == 0 or step == steps:
            acc = greedy_accuracy(model, tokenizer, task, held_out, max_new_tokens)
            history.append({"step": step, "loss": loss.item(), "accuracy": acc})
            if stop_at_accuracy is not None and acc >= stop_at_accuracy:
                break
    return {"steps": step, "accuracy": acc, "history": history}
