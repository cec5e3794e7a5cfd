"""Step time of each method's update, side by side in one run, as ratios vs dense Adam.

    python benchmarks/step_time.py [--config config/config.yaml] [--repeats 30] [--methods a,b]

For every method in the config's `run_methods` and `ablation_methods` (or `--methods`) it builds
the configured model (random init, same seed), its update rule and KL control, and times
`logra.rl.step.update_step` (forward/backward over the micro-batches, propose, KL prediction when
configured, apply, realized KL on the probe) on one fixed batch of the configured shape
(prompts_per_step x group_size sequences, fixed prompt and completion lengths), then the sync:
the payload pickled and unpickled (the transport) and applied to a separate copy of the weights
(what the rollout engine does). Rollout generation is the same for every method and left out.
Methods run interleaved round by round, so machine noise hits them alike; medians are reported.
Prints one table; nothing is written.
"""
from __future__ import annotations

from logra.repro import pin_cpu

pin_cpu()  # before torch loads: time the kernels the workflow's CPU jobs run (logra/repro.py)

import argparse
import copy
import pickle
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from logra import rules
from logra.harness.config import run_config, validate_file
from logra.harness.memory_point import fixed_batch
from logra.optim.kl_control import KLControl
from logra.rl.models import model_config, n_params
from logra.rl.settings import Grpo
from logra.rl.step import update_step
from logra.rl.weight_sync import apply_payload, payload_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--completion-len", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", help="comma-separated method names (default: run_methods + "
                                      "ablation_methods of the config)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = validate_file(args.config)
    g = config["grpo"]
    settings = Grpo.from_dict(g)
    hf_config = model_config(config["model"])
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(hf_config)
    n, width = g["prompts_per_step"] * g["group_size"], args.prompt_len + args.completion_len
    batch, probe = fixed_batch(hf_config.vocab_size, n, args.prompt_len, args.completion_len,
                               g["probe_size"])

    runs = {}
    names = (args.methods.split(",") if args.methods
             else dict.fromkeys(config["run_methods"] + config["ablation_methods"]))
    for name in names:
        cfg = run_config(config, next(iter(config["tasks"])), name, 0)["method"]
        model = copy.deepcopy(base)
        engine = {k: v.detach().clone() for k, v in model.named_parameters()}
        rule = rules.build(cfg["rule"], model, cfg["options"])
        kl = KLControl(**cfg["kl_control"]) if cfg["kl_control"] else None
        runs[name] = dict(model=model, rule=rule, kl=kl, engine=engine, bases={},
                          update=[], sync=[], bytes=[])
    for _ in range(args.repeats + 1):  # first round warms up, dropped below
        for r in runs.values():
            t0 = time.perf_counter()
            update_step(r["model"], None, r["rule"], r["kl"], batch, probe, settings)
            t1 = time.perf_counter()
            payload = pickle.loads(pickle.dumps(r["rule"].sync_payload()))
            apply_payload(r["engine"], payload, r["bases"])
            t2 = time.perf_counter()
            r["update"].append(t1 - t0)
            r["sync"].append(t2 - t1)
            r["bytes"].append(payload_bytes(payload))

    ref = runs.get(config["verdict"]["reference"])
    print(f"model {n_params(base) / 1e6:.2f}M params, batch {n} x {width} tokens, micro-batch "
          f"{g['micro_batch_size']}, {args.repeats} interleaved rounds, {args.threads} thread(s)")
    print(f"{'method':<14}{'update s':>10}{'+sync s':>10}{'ratio':>8}{'sync MB':>9}")
    for name, r in runs.items():
        upd = statistics.median(r["update"][1:])
        tot = statistics.median(u + s for u, s in zip(r["update"][1:], r["sync"][1:]))
        ref_tot = (statistics.median(u + s for u, s in zip(ref["update"][1:], ref["sync"][1:]))
                   if ref else float("nan"))
        print(f"{name:<14}{upd:>10.4f}{tot:>10.4f}{tot / ref_tot:>8.3f}"
              f"{statistics.mean(r['bytes'][1:]) / 1e6:>9.3f}")


if __name__ == "__main__":
    main()
