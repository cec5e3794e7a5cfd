"""One point of the memory and speed sweep: the same GRPO step, one method, one model size.

`measure(size_options, method, shape)` builds a randomly initialised tiny-config decoder of the
given size and a fixed batch, and runs the GRPO step as the trainer does: a timed rollout (on
CPU the engine lives in another process, so its memory is not part of the trainer's peak), the
update (`logra.rl.step.update_step`), then the sync payload. Step 1 warms up, step 2 is measured
with `MemoryMeter` (peak and breakdown), steps 3.. are timed (median); on CUDA,
`train_peak_mean_bytes` is the authors' memory statistic. Beside the measurement: the planner's
prediction (`logra.measure.planner.plan`) and its relative error.

With a memory budget the point records `status: oom` and what it needed instead of failing. A
point whose planned bytes exceed the memory available (`available_bytes`) is not allocated: it
records `status: oom` with the planner's bytes as what it needed, a prediction.

The batch, the step's phases, the CUDA statistic and the budget check in full: docs/memory.md,
"One point of the memory sweep".
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path

import torch

from logra import rules
from logra.common import POLICIES
from logra.measure.memory import MemoryMeter
from logra.measure.planner import plan
from logra.optim.kl_control import KLControl
from logra.rl.models import n_params, tiny_config
from logra.rl.step import cap_cuda_memory, compute_context, cuda_oom, update_step
from logra.rl.settings import Grpo
from logra.rl.weight_sync import payload_bytes


def fixed_batch(vocab_size: int, n: int, prompt_len: int, completion_len: int,
                probe_size: int, generator: torch.Generator | None = None,
                device: str | torch.device = "cpu") -> tuple[tuple, tuple]:
    """A GRPO batch of fixed shape: (ids, attn, loss mask over the completion, advantages) of
    `n` random sequences, and the probe (its first `probe_size` sequences)."""
    gen = generator or torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab_size, (n, prompt_len + completion_len), generator=gen).to(device)
    attn = torch.ones_like(ids)
    mask = torch.zeros(n, prompt_len + completion_len - 1, dtype=torch.long, device=device)
    mask[:, prompt_len - 1:] = 1
    adv = torch.randn(n, generator=gen).to(device)
    return (ids, attn, mask, adv), (ids[:probe_size], attn[:probe_size], mask[:probe_size])


DTYPES = {"float32": "fp32", "bfloat16": "bf16"}  # a torch dtype's name -> the planner's


def _planned(hf_config, method: dict, shape: dict, grpo: dict, compute_dtype: str) -> dict:
    """The planner's prediction for the point: the storage dtype (grpo.param_dtype), the
    compute dtype (bf16 weights compute in bf16 whatever it says), one device."""
    p_len, c_len = shape["prompt_len"], shape["completion_len"]
    storage = DTYPES[grpo.get("param_dtype", "float32")]
    planned = plan(hf_config, method["rule"], method["options"], micro_batch=shape["micro_batch"],
                policy=storage,
                seq_len=p_len + c_len, probe_size=grpo["probe_size"], completion_len=c_len,
                kl_control=bool(method.get("kl_control")) or rules.rule_class(
                    method["rule"]).has_control(method["options"]),
                attention_mask=False,  # no padding: HF's sdpa then takes no mask
                compute=min(storage, DTYPES[compute_dtype], key=POLICIES.get),
                chunk_tokens=grpo.get("chunk_tokens"))
    if POLICIES[storage] < 4 and planned["master"]:
        raise ValueError(f"memory point: rule {method['rule']!r} plans a float32 master copy "
                         f"beside {grpo['param_dtype']} weights, which that storage has not; "
                         "a rule that plans bf16 storage alone (adamw_8bit with "
                         "bf16_stochastic_round) is measured there")
    return planned


def available_bytes(device: torch.device) -> int:
    """The memory a point may take: the device's free bytes on CUDA, else the machine's
    available memory (/proc/meminfo's MemAvailable, else all of its physical memory)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure(size: dict, method: dict, shape: dict, grpo: dict, *, steps: int = 4,
            device: str = "cpu", budget_bytes: int | None = None, seed: int = 0,
            compute_dtype: str = "float32", lengths: list[int] | None = None) -> dict:
    """`size`: tiny_config options; `method`: {rule, options, kl_control}; `shape`: batch,
    micro_batch, prompt_len, completion_len; `grpo`: the run config's grpo section (loss
    settings and `param_dtype`, the weights' storage; batch sizes are taken from `shape`).
    `compute_dtype: bfloat16` runs the update under autocast on the stored weights (and the
    planner predicts bf16 compute on that storage). `lengths`: the completion length of each
    update from the measured one (step 2) on, cycled, so that the authors' statistic (the
    mean over updates of each update's peak, `train_peak_mean_bytes`) is taken over updates of
    different lengths, as a run's are (default: completion_len every update); the measured
    step, its phases and the planner's prediction are those of the first length."""
    if steps < 3:
        raise ValueError(f"memory_sweep.steps={steps}: needs >= 3 (warm-up, measured, timed)")
    from transformers import AutoModelForCausalLM  # after logra.rl.models (its docstring)
    torch.manual_seed(seed)
    dev = torch.device(device)
    hf_config = tiny_config(**size)
    n, p_len = shape["batch"], shape["prompt_len"]
    lengths = list(lengths or [shape["completion_len"]])
    shape = {**shape, "completion_len": lengths[0]}
    point = {"vocab_size": hf_config.vocab_size, "rule": method["rule"], "device": str(dev),
             "threads": torch.get_num_threads(), "compute_dtype": compute_dtype,
             "batch": n, "micro_batch": shape["micro_batch"], "seq_len": p_len + lengths[0],
             "memory_budget_bytes": budget_bytes, "status": "ok",
             "planned": _planned(hf_config, method, shape, grpo, compute_dtype)}
    room = available_bytes(dev)
    if point["planned"]["total"] > room:  # refused before allocating: a prediction
        with torch.device("meta"):  # the parameters counted, none allocated
            point["n_params"] = n_params(AutoModelForCausalLM.from_config(hf_config))
        return point | {"status": "oom", "peak_mem_bytes": None, "oom_needed_bytes": point[
            "planned"]["total"], "oom_check": f"the planner's bytes (a prediction) against the "
            f"{room} bytes available on {dev.type}, before allocating"}
    model = AutoModelForCausalLM.from_config(
        hf_config, dtype=getattr(torch, grpo.get("param_dtype", "float32"))).to(dev)
    point["n_params"] = n_params(model)
    settings = Grpo.from_dict(dict(grpo, micro_batch_size=shape["micro_batch"]))
    batches = {c: fixed_batch(hf_config.vocab_size, n, p_len, c, grpo["probe_size"],
                              torch.Generator().manual_seed(seed), dev) for c in set(lengths)}
    cap_cuda_memory(budget_bytes, dev)
    times, rollout_times, sync, train_peaks, ran = [], [], [], [], []
    try:  # building the rule allocates too (its state; 8-bit AdamW compiles on throwaway weights)
        rule = rules.build(method["rule"], model, method["options"])
        kl = KLControl(**method["kl_control"]) if method.get("kl_control") else None
        for step in range(1, steps + 1):
            c_len = lengths[(step - 2) % len(lengths)] if step >= 2 else lengths[0]
            batch, probe = batches[c_len]
            ids, attn = batch[0], batch[1]
            ran.append(p_len + c_len)
            if step == 2 and dev.type == "cuda":  # the rollout's own peak
                torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(input_ids=ids[:, :p_len], attention_mask=attn[:, :p_len],
                               min_new_tokens=c_len, max_new_tokens=c_len, do_sample=True,
                               top_k=0, top_p=1.0, pad_token_id=0)
            t1 = time.perf_counter()
            if step == 2 and dev.type == "cuda":
                rollout_peak = torch.cuda.max_memory_allocated(dev)
            meter = (MemoryMeter(dev, labels={"optimizer": rule.state_tensors(),
                                              "grads": rule.grad_buffers(),
                                              "weights": list(model.parameters())})
                     if step == 2 else contextlib.nullcontext())
            if step > 2 and dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            with meter, compute_context(dev, getattr(torch, compute_dtype)):
                update_step(model, None, rule, kl, batch, probe, settings,
                            phase=getattr(meter, "phase", None))
            if step == 2:
                report = meter.report
            if step >= 2 and dev.type == "cuda":  # the meter resets the peak at each phase
                train_peaks.append(report.peak_bytes if step == 2
                                   else torch.cuda.max_memory_allocated(dev))
            t2 = time.perf_counter()
            sync.append(payload_bytes(rule.sync_payload()))
            if step > 2:
                times.append(t2 - t1)
                rollout_times.append(t1 - t0)
    except torch.OutOfMemoryError as e:
        point.update(status="oom", peak_mem_bytes=None, **cuda_oom(e, dev))
        return point
    point.update(
        peak_mem_bytes=report.peak_bytes, mem_breakdown=report.by_category,
        # each phase's peak in the measured step (CUDA: the rollout's first)
        phase_peaks=({"rollout": rollout_peak} if dev.type == "cuda" else {}) | report.phase_peaks,
        mem_measure=report.method, optimizer_state_bytes=rule.state_bytes(),
        update_time_s=statistics.median(times), rollout_time_s=statistics.median(rollout_times),
        sync_bytes_per_step=statistics.mean(sync[1:]),
        train_peak_mean_bytes=statistics.mean(train_peaks) if train_peaks else None,
        update_seq_lens=ran,
        planned_error=point["planned"]["total"] / report.peak_bytes - 1)
    point["peak_phase"] = max(point["phase_peaks"], key=point["phase_peaks"].get, default=None)
    if budget_bytes and report.peak_bytes > budget_bytes:
        point.update(status="oom", oom_check="measured peak vs budget (CPU: after the fact)",
                     oom_needed_bytes=report.peak_bytes)
    return point
