"""The speed cost of the reproducible CPU pin, pinned and unpinned side by side in one run.

    python benchmarks/cpu_pin.py [--config config/config.yaml] [--steps 12] [--rounds 3]
                                 [--methods dense_adam,logra]

For each method, the same short GRPO run (`logra.rl.loop.train`: rollouts in the engine process,
forward/backward, propose, KL control, apply, sync) on the config's first task and model,
randomly initialised from the data seed (no SFT), runs in fresh processes: once with
`logra.repro.PIN` in the environment and once without it. Both use one thread, so only the
instruction path differs. Rounds alternate which goes first, so machine noise hits both alike.
The model's weights are random, so its completions run to max_new_tokens and its
rewards are 0: the work of a step, not its learning. Prints each process's capability, the
median step time over all rounds (the first step and the memory-profiled step left out), the
pinned / unpinned ratio, and whether the two paths computed the same bits
(`logra.harness.fingerprints.canary`). Nothing is written outside a temporary directory.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from logra.repro import PIN


def worker(config_path: str, method: str, steps: int, out: str) -> None:
    """One run in this process, on whatever path the environment set."""
    import torch

    from logra import repro
    from logra.files import write_jsonl
    from logra.harness import fingerprints
    from logra.harness.config import run_config, validate_file
    from logra.rl.loop import train
    from logra.rl.models import build_tiny
    from logra.rl.tasks import get_task

    config = validate_file(config_path)
    task = next(iter(config["tasks"]))
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny(Path(tmp) / "base", seed=config["data"]["seed"],
                          **config["model"]["tiny"])
        spec = config["tasks"][task]
        rows = get_task(spec["type"], **spec.get("options", {})).splits(
            config["data"]["seed"], 256, 16)["train"]
        write_jsonl(Path(tmp) / "train.jsonl", rows)
        cfg = run_config(config, task, method, 0)
        cfg["grpo"] |= {"steps": steps, "checkpoint_every": 0}
        train(cfg, base, Path(tmp) / "train.jsonl", Path(tmp) / "run")
        with open(Path(tmp) / "run/metrics.csv") as f:
            times = [float(row["step_time_s"]) for row in csv.DictReader(f)
                     if int(row["step"]) not in (1, cfg["grpo"]["profile_step"])]
    Path(out).write_text(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                                     "times": times, "canary": fingerprints.canary(),
                                     "cpu": repro.machine()["cpu_model"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", default="dense_adam,logra")
    ap.add_argument("--worker", nargs=2, metavar=("METHOD", "OUT_JSON"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.config, args.worker[0], args.steps, args.worker[1])
    unpinned = {k: v for k, v in os.environ.items() if k not in PIN} | {"OMP_NUM_THREADS": "1"}
    envs = {"pinned": os.environ | PIN, "unpinned": unpinned}
    results = {(m, mode): [] for m in args.methods.split(",") for mode in envs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for method in args.methods.split(","):
                for mode in (list(envs) if r % 2 == 0 else list(envs)[::-1]):
                    out = Path(tmp) / "out.json"
                    subprocess.run([sys.executable, __file__, "--config", args.config,
                                    "--steps", str(args.steps), "--worker", method, str(out)],
                                   env=envs[mode], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                    results[method, mode].append(json.loads(out.read_text()))
    first = next(iter(results.values()))[0]
    print(f"{first['cpu']}; {args.steps}-step GRPO runs of {args.config}'s first task, "
          f"{args.rounds} rounds, 1 thread; median step time (s)")
    print(f"{'method':<12}{'pinned':>18}{'unpinned':>18}{'ratio':>8}  same bits")
    for method in args.methods.split(","):
        p, u = results[method, "pinned"], results[method, "unpinned"]
        tp = statistics.median(t for x in p for t in x["times"])
        tu = statistics.median(t for x in u for t in x["times"])
        same = {x["canary"] for x in p} == {x["canary"] for x in u}
        print(f"{method:<12}{tp:>10.4f} ({p[0]['capability']:>6}){tu:>10.4f} "
              f"({u[0]['capability']:>6}){tp / tu:>8.3f}  {same}")


if __name__ == "__main__":
    main()
