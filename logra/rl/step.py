"""One GRPO update: the loss over the batch's micro-batches (accumulate_gradients), the rule's
proposed step, its size from the predicted-KL control, the apply (update_step); and the device
helpers around it (autocast, the CUDA memory cap, out-of-memory as a result). The loop
(logra/rl/loop.py) and one memory sweep point (logra/harness/memory_point.py) both run it."""
from __future__ import annotations

import contextlib
import math
import re
import time

import torch

from logra.optim import collectives
from logra.optim.collectives import local
from logra.optim.kl_control import at_cap, probe_base, probe_kl, split_probe
from logra.rl.loss import estimator as choose_estimator
from logra.rl.loss import kl_k3, token_logprobs
from logra.rl.settings import Grpo

CONTROL_METRICS = ("kl_budget", "mismatch_ema", "control_seconds", "step_at_cap")


def update_step(model, ref_model, rule, kl_control, batch, probe, grpo: Grpo,
                max_scale: float = 1.0, phase=None, engine_logp=None, completed=None,
                cosine: bool = False, estimator=None, old_logp=None) -> tuple:
    """One update: gradients, propose, (KL-controlled) apply, realized KL on the probe.

    The step's control is the rule's own (`rule.control`, LoGRA's budget) or `kl_control` (the
    config's), or none (scale `max_scale`). The probe is split (logra/optim/kl_control.py): the
    control predicts on its first half, the realized KL is measured on the second.
    `max_scale` caps the step scale (the schedule's: warmup, decay; a rule that is not
    `scalable` takes it as a factor on its lr, `UpdateRule.lr_scale`). `phase(name)`, if given,
    is called at the end of each phase (`MemoryMeter.phase`: forward_backward, propose,
    kl_control, apply). Returns (loss, step scale η, predicted KL at η or nan, realized KL,
    {the trainer-vs-engine log-prob mismatch and the token entropy (`accumulate_gradients`)
    and CONTROL_METRICS: the control's budget and mismatch EMA where it has them, its seconds,
    whether η is at its cap}). `completed`: per sequence, whether its response ended with eos (the signed
    mismatch's). `cosine`: also "update_cosine", the cosine between the applied step and the
    batch's negative dense gradient over every trained weight (`rule.dense_gradients`; nan
    where the rule cannot keep it), a diagnostic that copies the weights and gradients once.
    `estimator` and `old_logp`: `accumulate_gradients`'."""
    phase = phase or (lambda name: None)
    control = rule.control or kl_control
    fit, held_out = split_probe(probe)
    diagnose, cos = None, math.nan
    if cosine:
        with contextlib.suppress(NotImplementedError):
            diagnose = rule.dense_gradients()
    with diagnose or contextlib.nullcontext():
        loss, mismatch = accumulate_gradients(model, ref_model, *batch, grpo,
                                              engine_logp=engine_logp, completed=completed,
                                              estimator=estimator, old_logp=old_logp)
        dense = ({n: p.grad.detach().clone() for n, p in rule.named if p.grad is not None}
                 if diagnose else {})
        before = {n: p.detach().clone() for n, p in rule.named} if dense else {}
    rule.batch_tokens = int(batch[2].sum())
    phase("forward_backward")
    chunk = grpo.chunk_tokens
    if control and control.needs_base:  # one forward over the probe, split: the halves share
        base_fit, base_held_out = probe_base(  # the weights' copy
            model, probe, grpo.temperature, chunk).split(fit)
    else:  # only the realized KL, on the held-out half
        base_fit, base_held_out = None, probe_base(model, held_out, grpo.temperature, chunk)
    if not rule.scalable:  # it steps inside propose(): the schedule scales its lr there
        rule.lr_scale = max_scale
    step_delta = rule.propose()
    phase("propose")
    start, info = time.time(), {}
    if control:
        eta, kl_pred, info = control.scale(
            model, rule, step_delta, fit, base=base_fit, max_scale=max_scale,
            temperature=grpo.temperature, mismatch=mismatch["logp_mismatch_signed"],
            chunk_tokens=chunk)
    else:
        eta, kl_pred = max_scale, math.nan
    info = {k: math.nan for k in CONTROL_METRICS} | info | {
        "control_seconds": time.time() - start if control else math.nan,
        "step_at_cap": float(bool(control) and at_cap(control, eta, max_scale))}
    del base_fit
    phase("kl_control")
    rule.apply(step_delta, eta)
    del step_delta
    kl_real = probe_kl(model, base_held_out, held_out)
    phase("apply")
    if dense:
        cos = update_cosine(rule.named, before, dense)
    return loss, eta, kl_pred, kl_real, mismatch | info | ({"update_cosine": cos} if cosine
                                                          else {})


def update_cosine(named, before: dict, dense: dict) -> float:
    """cos(θ_now − θ_before, −G) over the trained weights `named` (sharded: over all ranks)."""
    sums = torch.zeros(3, dtype=torch.float64, device=next(iter(dense.values())).device)
    for n, p in named:
        if n not in dense:
            continue
        delta, grad = (local(p.detach()) - local(before[n])).double(), local(dense[n]).double()
        sums += torch.stack([-(delta * grad).sum(), delta.square().sum(), grad.square().sum()])
    dot, dd, gg = collectives.all_reduce(sums).tolist()
    return dot / math.sqrt(dd * gg) if dd > 0 and gg > 0 else math.nan


def rank_chunks(n: int, grpo: Grpo) -> list[slice]:
    """This rank's micro-batches of a batch of `n` sequences: under FSDP rank r takes the r-th
    micro-batch of each global one of micro_batch_size x world sequences."""
    mb, rank, world = grpo.micro_batch_size, collectives.rank(), collectives.world_size()
    return [slice(i + rank * mb, i + (rank + 1) * mb) for i in range(0, n, mb * world)]


def accumulate_gradients(model, ref_model, ids, attn, mask, adv, grpo: Grpo,
                         engine_logp=None, completed=None, estimator=None,
                         old_logp=None) -> tuple[float, dict]:
    """Forward/backward over micro-batches; gradients accumulate (or are consumed by the
    update rule's hooks). The loss is the `estimator`'s (default: the one grpo.estimator
    names, `logra.rl.loss.estimator`): GRPO's, or the authors' REINFORCE, its importance
    weights from `engine_logp`. Returns the full-batch
    loss and the mismatch between the trainer's and the engine's log-probs of the sampled
    completion tokens, from this forward (the old log-probs) and `engine_logp` (`pad_batch`):
    {"logp_mismatch_mean", "logp_mismatch_max"} of |log π_trainer − log π_engine| over every
    completion token, and
    "logp_mismatch_signed", the mean of log π_engine − log π_trainer over the tokens of the
    responses that ended with eos (`completed`, per sequence; LoGRA's controller subtracts
    it; nan without such tokens), all nan without `engine_logp`; and "token_entropy",
    −mean log π_trainer over every completion token: the rollouts sample at the loss's
    temperature with no top-k or top-p, so each token's −log π has, given its prefix, the
    sampling policy's entropy there as its expectation (a one-sample estimate; no pass over
    the vocabulary). `old_logp` (B, T-1), if given, receives this rank's rows of the
    trainer's log-probs (`batch_kl`'s π_old)."""
    estimator = estimator or choose_estimator(grpo)
    n, world = ids.shape[0], collectives.world_size()
    normalizer = mask.sum().clamp(min=1) if grpo.aggregation == "dapo" else n
    total = 0.0
    # sum, tokens, max of |Δ|; sum and tokens of the signed engine − trainer on completed ones;
    # sum of −log π and tokens over every completion token
    gap = torch.zeros(7, dtype=torch.float64, device=ids.device)
    for c in rank_chunks(n, grpo):
        logp = token_logprobs(model, ids[c], attn[c], grpo.temperature, grpo.chunk_tokens)
        trainer = logp.detach().double()
        if old_logp is not None:
            old_logp[c] = logp.detach()
        gap[5] -= trainer[mask[c].bool()].sum()
        gap[6] += mask[c].sum()
        if engine_logp is not None:
            signed = engine_logp[c].double() - trainer
            d = signed.abs()[mask[c].bool()]
            gap[0] += d.sum()
            gap[1] += d.numel()
            gap[2] = torch.cat([d, gap[2:3]]).max()
            if completed is not None:
                done = mask[c].bool() & completed[c].to(mask.device)[:, None]
                gap[3] += signed[done].sum()
                gap[4] += done.sum()
        loss = estimator.loss(logp, None if engine_logp is None else engine_logp[c], adv[c],
                              mask[c], grpo, normalizer)
        if ref_model is not None:
            with torch.no_grad():
                ref = token_logprobs(ref_model, ids[c], attn[c], grpo.temperature,
                                     grpo.chunk_tokens)
            loss = loss + grpo.beta * (kl_k3(logp, ref) * mask[c]).sum() / normalizer
        (loss * world).backward()  # FSDP averages over ranks: the sum is wanted
        total += loss.item()
    loss = collectives.all_reduce(torch.tensor(total, dtype=torch.float64,
                                               device=ids.device)).item()
    summed = collectives.all_reduce(gap[[0, 1, 3, 4, 5, 6]])
    mismatch = dict.fromkeys(("logp_mismatch_mean", "logp_mismatch_max",
                              "logp_mismatch_signed"), math.nan) | {
        "token_entropy": (summed[4] / summed[5]).item() if summed[5] > 0 else math.nan}
    if engine_logp is not None:
        peak = collectives.all_reduce(gap[2:3], op="max")
        if summed[1] > 0:
            mismatch |= {"logp_mismatch_mean": (summed[0] / summed[1]).item(),
                         "logp_mismatch_max": peak.item()}
        if summed[3] > 0:
            mismatch["logp_mismatch_signed"] = (summed[2] / summed[3]).item()
    return loss, mismatch


def batch_kl(model, ids, attn, mask, old_logp, grpo: Grpo) -> float:
    """KL(π_old ‖ π_new) per completion token over the whole step batch, after the update: the
    mean over the batch's sampled completion tokens of k3 = exp(d) − d − 1, d = log π_new −
    log π_old (logra.rl.loss.kl_k3), π_old's log-probs from the update's own forward
    (`old_logp`, `accumulate_gradients`), π_new's from one forward without gradients here. k3 is
    an unbiased, non-negative estimate of the KL where the tokens are samples of π_old: the
    rollouts are the engine's samples, π_old itself under a lossless sync (as far as the
    trainer-vs-engine mismatch, logged beside it, says otherwise). Per-token log-probs only:
    nothing of (tokens x vocabulary) is kept across the update."""
    sums = torch.zeros(2, dtype=torch.float64, device=ids.device)
    with torch.no_grad():
        for c in rank_chunks(ids.shape[0], grpo):
            new = token_logprobs(model, ids[c], attn[c], grpo.temperature, grpo.chunk_tokens)
            keep = mask[c].bool()
            sums += torch.stack([kl_k3(old_logp[c].double(), new.double())[keep].sum(),
                                 keep.sum().double()])
    total, tokens = collectives.all_reduce(sums).tolist()
    return total / tokens if tokens else math.nan


def compute_context(device: torch.device, dtype: torch.dtype):
    """Around an update step: bf16 autocast for a float32 model (no FSDP), else nothing. The
    autocast cache of cast weights is off: the probe and KL forwards inside the step must see
    the weights as updated in it."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=False)


def cap_cuda_memory(budget_bytes: int | None, device: torch.device) -> None:
    """Cap the CUDA allocator at `budget_bytes` (None: lift the cap and free the cache)."""
    if device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, (budget_bytes or total) / total), device)
    if budget_bytes is None:
        torch.cuda.empty_cache()


def cuda_oom(error: torch.OutOfMemoryError, device: torch.device) -> dict:
    """What a capped CUDA run needed: bytes allocated at the failure + the failed request
    (parsed from the message), a lower bound of the true peak."""
    sizes = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    hit = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", str(error))
    request = int(float(hit.group(1)) * sizes[hit.group(2)]) if hit else 0
    return {"oom_check": "CUDA allocator capped at the budget (needed: a lower bound)",
            "oom_needed_bytes": torch.cuda.memory_allocated(device) + request}


