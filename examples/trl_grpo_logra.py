"""LoGRA in TRL: GRPOTrainer on one of this project's tasks, on the CPU, LoGRA vs TRL's AdamW.

    python examples/trl_grpo_logra.py                       # countdown, 40 steps each
    python examples/trl_grpo_logra.py --task arithmetic --steps 20 --out results/trl/arithmetic.json
    python examples/trl_grpo_logra.py --base results/base/countdown/seed0/model  # the workflow's base

The model, the task, the SFT warm start, the batch sizes and both methods' lrs come from the
config (`--config`, config/config.yaml): the tiny model the workflow trains is built locally
and warm-started by SFT (a random model never earns a reward, so GRPO would have nothing to
learn from), unless `--base` names a model directory. Then TRL's GRPOTrainer trains it for
`--steps` steps twice from the same base: with `logra.LoGRAOptimizer` passed as
`optimizers=(optimizer, scheduler)` (the trainer class mixes in `LoGRATrainerMixin`, which
counts the completion tokens LoGRA divides its sketch by and hands the step's first micro-batch
to LoGRA's predicted-KL controller, which sets α), and with TRL's default AdamW. The task's
reward is TRL's reward function (`logra.harness.trl_grpo.reward_function`). The output JSON holds,
per method, the measured peak memory of one update step (logra/measure/memory.py, device and model
size beside it) and the mean reward of the first and the last steps' rollouts, and LoGRA's mean α
and share of steps at alpha_max; `snakemake trl`
writes one per task of the config and results/REPORT.md collects them. How the code looks in a TRL
script: `logra.harness.trl_grpo.train_grpo`.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is built locally
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402

from logra.files import write_json
from logra.harness.config import resolve, task_options
from logra.harness.trl_grpo import compare, config_options
from logra.rl.models import build_tiny, load
from logra.rl.sft import sft
from logra.rl.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


def warm_base(config: dict, task_name: str, task, rows: list[dict], out_dir: Path,
              seed: int) -> Path:
    """The config's tiny model, built and SFT-trained on `rows` (as the workflow's `base`
    stage does, without its lm-eval), saved to `out_dir`."""
    if config["model"]["name"] != "tiny":
        raise ValueError(f"model.name={config['model']['name']!r}: pass --base, this example "
                         "builds only the local tiny model")
    path = build_tiny(out_dir, seed=seed, **config["model"].get("tiny", {}))
    model, tokenizer = load(path)
    s = task_options(config["sft"], task_name)
    result = sft(model, tokenizer, task, rows, steps=s["steps"], batch_size=s["batch_size"],
                 lr=s["lr"], stop_at_accuracy=None, eval_every=s["eval_every"],
                 eval_examples=s["eval_examples"], warmup_steps=s["warmup_steps"],
                 decay=s["decay"], decay_final=s["decay_final"],
                 max_new_tokens=config["grpo"]["max_new_tokens"], seed=seed)
    print(f"SFT base: {result['steps']} steps, held-out greedy accuracy {result['accuracy']:.3f}")
    model.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="countdown", help="a task of the config")
    parser.add_argument("--config", default=str(ROOT / "config/config.yaml"))
    parser.add_argument("--base", help="a model directory to start from (default: build the "
                        "config's tiny model and SFT it)")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per method")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", help="output JSON (default results/trl/<task>.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = resolve([args.config])  # over config/config.yaml, as the workflow reads it
    if args.task not in config["tasks"]:
        raise SystemExit(f"--task {args.task}: not in {args.config} (tasks: "
                         f"{', '.join(config['tasks'])})")
    spec = config["tasks"][args.task]
    task = get_task(spec["type"], **spec.get("options", {}))
    rows = task.splits(config["data"]["seed"], config["data"]["n_train"],
                       config["data"]["n_test"])["train"]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.base) if args.base else warm_base(config, args.task, task, rows,
                                                           Path(tmp) / "base", args.seed)
        result = compare(base, task, rows, steps=args.steps,
                         **config_options(config, args.task), seed=args.seed)
    result["base"] = str(args.base) if args.base else "built and SFT-trained by the example"
    out = Path(args.out or ROOT / "results/trl" / f"{args.task}.json")
    write_json(out, result)
    mib = 2**20
    for method in ("logra", "adamw"):
        r = result[method]
        print(f"trl {args.task}/{method}: peak {r['peak_mem_bytes'] / mib:.2f} MiB (step "
              f"{result['profile_step']}, cpu, {result['model']['n_params']:,} parameters), "
              f"reward {r['reward_first']:.3f} -> {r['reward_last']:.3f} after {args.steps} steps"
              + (f", mean alpha {r['alpha_mean']:.3g} ({r['steps_at_alpha_max_share']:.0%} of "
                 "steps at alpha_max)" if "alpha_mean" in r else ""))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
