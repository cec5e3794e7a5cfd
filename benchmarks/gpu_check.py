"""The GPU check: one command, a few minutes on one GPU, on a bare CUDA machine.

    python benchmarks/gpu_check.py                  # CUDA: ~0.5B and ~1.5B parameters, bf16
    python benchmarks/gpu_check.py --device cpu --size tiny   # the same code, small, here
    python benchmarks/gpu_check.py --lengths 128,512,1024,256 # updates of these completions

Needs only torch (>= 2.11), transformers (>= 5.17), pandas and PyYAML: no Snakemake, lm-eval
or vLLM. GaLore runs where galore-torch imports: bring its wheel (50 kB) and that of
bitsandbytes (43 MB, imported by galore_torch's package) with `pip download --no-deps
galore-torch==1.0 bitsandbytes==0.50.2` and `pip install --no-deps` them there; without them
GaLore is skipped and the output says so.

1. The same GRPO update step (`logra.harness.memory_point.measure`: rollout, micro-batched
   forward and backward, propose, LoGRA's KL control, apply, sync payload) for dense AdamW,
   GaLore and LoGRA at the authors' defaults on a randomly initialised decoder of Qwen2.5-0.5B's
   and Qwen2.5-Math-1.5B's shapes, bf16 compute on float32 weights and optimizer state: CUDA
   peak memory (allocator, `max_memory_allocated`) of the step and of each of its phases, the
   authors' statistic (the mean over updates of the update's peak, to set beside their 45.7%),
   update time, sync bytes, each with its ratio to dense Adam, and the planner's prediction for
   the same shape with its error, printed side by side.
2. Where vLLM is installed: the vLLM rollout engine on the same architecture (saved to a
   temporary directory), one generate, then LoGRA's sync payloads applied inside vLLM's worker
   (`VLLMSyncExtension`): the time per sync and the drift of vLLM's bf16 weights from the
   trainer's after the syncs (max |W_vllm - W| / max |W|). Skipped, saying so, elsewhere.
Nothing is written; the numbers are printed with the device and versions they were measured on.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import transformers
import yaml

SIZES = {  # tiny-config options: Qwen2.5-0.5B's and Qwen2.5-Math-1.5B's shapes (151,936-token
    # vocabulary, tied embeddings; randomly initialised), and a 0.35M-parameter one for the CPU;
    # 0.5B's as `snakemake memory_real` measures it on the CPU (config.yaml's memory_real)
    "0.5b": yaml.safe_load((Path(__file__).resolve().parents[1] / "config/config.yaml")
                           .read_text())["memory_real"]["model"],
    "1.5b": dict(architecture="qwen2", hidden_size=1536, intermediate_size=8960,
                 num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4),
}


def methods_at(size: str) -> dict:
    """Dense AdamW, GaLore and the authors' LoGRA at their defaults (rank 256, update_ratio
    6e-5, its controller probing 2 sequences; rank 16 at the tiny size)."""
    return {
        "dense_adam": {"rule": "dense_adam", "options": {"lr": 1e-6}, "kl_control": None},
        "galore": {"rule": "galore", "options": {"lr": 1e-5, "rank": 256 if size != "tiny"
                                                 else 16, "update_proj_gap": 200},
                   "kl_control": None},
        "logra": {"rule": "logra", "options": {"rank": 256 if size != "tiny" else 16},
                  "kl_control": None},
    }


# the grpo keys the checks set, the schema's defaults for the rest (logra.harness.config)
GRPO = {"aggregation": "dapo", "temperature": 1.0, "clip_low": 0.2, "clip_high": 0.28,
        "probe_size": 8, "estimator": "grpo"}


def grpo(**values) -> dict:
    """GRPO (and `values`) over the schema's defaults: a run config's grpo section."""
    import dataclasses

    from logra.harness.config import grpo_settings
    return dataclasses.asdict(grpo_settings(GRPO | values))
PHASES = ["rollout", "forward_backward", "propose", "kl_control", "apply"]


def available(methods: dict) -> dict:
    """The methods whose packages import here; says which are skipped and why."""
    from logra.rules import rule_class
    out = {}
    for name, m in methods.items():
        try:
            rule_class(m["rule"])
        except ValueError as e:  # its module's imports fail here
            print(f"{name}: skipped ({e}; see the module docstring)")
            continue
        out[name] = m
    return out


def step_table(size: dict, shape: dict, device: str, dtype: str, methods: dict,
               lengths: list[int] | None = None) -> None:
    from logra.analysis.tables import memory_sweep_table
    from logra.harness.memory_point import measure
    steps = max(5, 1 + len(lengths or []))  # a warm-up, then every length at least once
    points = {("check", name): measure(size, m, shape, grpo(), steps=steps, device=device,
                                       compute_dtype=dtype, lengths=lengths)
              for name, m in methods.items()}
    table = memory_sweep_table(points, "dense_adam")  # ratios vs dense Adam, as the memory sweep's
    gb = [c for c in ("peak_mem_bytes", "planned_total", *(f"phase_{p}" for p in PHASES))
          if c in table]
    for col in gb:
        table[col.replace("_mem_bytes", "").replace("planned_total", "planned") + "_GB"] = \
            pd.to_numeric(table[col]) / 1e9
    # the authors' statistic (memory/train_peak_allocated_gib), in GiB as they log it
    table["train_peak_GiB"] = pd.to_numeric(table["train_peak_mean_bytes"]) / 2**30
    table["train_peak_reduction"] = 1 - table["train_peak_mean_bytes_vs_reference"]
    table["sync_MB"] = table["sync_bytes_per_step"] / 1e6
    print(f"\n{table['n_params'][0] / 1e6:,.1f}M parameters, {dtype} compute on float32 weights "
          f"and moments, device {device} "
          f"({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), "
          f"batch {shape['batch']} x {shape['prompt_len'] + shape['completion_len']} tokens"
          + (f" (the updates' completions: {lengths} tokens, cycled)" if lengths else "") + ", "
          f"micro-batch {shape['micro_batch']}; peak memory measured by "
          f"{next(iter(points.values())).get('mem_measure')}; planned = logra.measure.planner "
          f"(a prediction: fp32 storage, {dtype} compute); train_peak = the authors' memory "
          "statistic: the mean over updates of the update's allocator peak, rollout excluded "
          "(CUDA only), and its reduction vs dense Adam")
    cols = ["method", "peak_GB", "peak_mem_bytes_vs_reference", "planned_GB", "planned_error",
            "train_peak_GiB", "train_peak_reduction",
            *[c for c in (f"phase_{p}_GB" for p in PHASES) if c in table],
            "update_time_s", "update_time_s_vs_reference", "sync_MB",
            "sync_bytes_per_step_vs_reference", "status"]
    with pd.option_context("display.width", 250, "display.precision", 3):
        print(table[cols].to_string(index=False))


def vllm_sync(size: str, syncs: int = 5) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("\nvLLM sync path: skipped (vllm is not installed)")
        return
    from transformers import AutoModelForCausalLM

    from logra.harness.memory_point import fixed_batch
    from logra.optim.logra_rule import LoGRA
    from logra.rl.guards import sync_drift
    from logra.rl.models import build_tiny
    from logra.rl.vllm_engine import VLLMRolloutEngine
    from logra.rl.settings import Grpo
    from logra.rl.step import accumulate_gradients
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny(tmp, **SIZES[size])
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).cuda()
        rule = LoGRA(model, **methods_at(size)["logra"]["options"])
        engine = VLLMRolloutEngine(tmp, dtype="bfloat16", gpu_memory_utilization=0.3)
        t0 = time.perf_counter()
        rollouts = engine.generate(["Q: 12+30\nA: "] * 4, 4, 32, 1.0, 0)
        print(f"\nvLLM: {len(rollouts)} rollouts in {time.perf_counter() - t0:.2f} s")
        (ids, attn, mask, adv), _ = fixed_batch(model.config.vocab_size, 16, 32, 32, 8,
                                                device="cuda")
        g = Grpo.from_dict(grpo(micro_batch_size=8))
        times, sent = [], 0
        for _ in range(syncs):
            accumulate_gradients(model, None, ids, attn, mask, adv, g)
            rule.apply(rule.propose(), 1.0)
            payload = rule.sync_payload()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sent += engine.sync(payload)
            times.append(time.perf_counter() - t0)
        drift = sync_drift(engine.state_dict(), {n: w.cpu() for n, w in
                                                 rule.engine_weights().items()})
        path = engine.sync_path()  # in place on a GPU, unless vLLM repacked the weights
        print(f"vLLM sync of LoGRA payloads ({path['path']}, host copy "
              f"{path['host_copy_bytes'] / 1e6:.1f} MB): {syncs} syncs, "
              f"{sent / syncs / 1e6:.2f} MB each, median "
              f"{sorted(times)[len(times) // 2] * 1e3:.1f} ms; drift of vLLM's bf16 weights "
              f"after them {drift:.2e} (bf16 resolution ~4e-3)")
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="0.5b,1.5b",
                    help=f"comma-separated, from {sorted(SIZES)} (default: 0.5b,1.5b)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--lengths", default=None,
                    help="comma-separated completion lengths (tokens), one per update, cycled: "
                         "the authors' statistic over updates of different lengths, as a run's "
                         "are (default: every update at the shape's completion length)")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else None
    sizes = args.size.split(",")
    if unknown := set(sizes) - set(SIZES):
        raise SystemExit(f"gpu_check: unknown --size {sorted(unknown)}; known: {sorted(SIZES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device visible (use --device cpu --size tiny to "
                         "run the same code here)")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}")
    for size in sizes:
        # the authors' micro-batch of 1; 1,024-token sequences (theirs: up to 4,096, with
        # activation checkpointing), 128 of them generated
        shape = ({"batch": 16, "micro_batch": 1, "prompt_len": 896, "completion_len": 128}
                 if size != "tiny" else
                 {"batch": 8, "micro_batch": 4, "prompt_len": 8, "completion_len": 8})
        step_table(SIZES[size], shape, args.device, args.dtype, available(methods_at(size)),
                   lengths)
    if args.device == "cuda":
        vllm_sync(sizes[0])
    else:
        print("\nvLLM sync path: skipped on --device cpu (vLLM's CPU build and its sync: "
              "tests/rl/test_vllm.py, from .venv-vllm)")


if __name__ == "__main__":
    main()
