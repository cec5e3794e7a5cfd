"""results/study/<horizon>/drift/{task}/{method}/seed{seed}.json: a study test run's policy at
its last update (its saved model; where it stopped early, its last good one: intent to treat)
against its SFT base, on the stability criterion's fixed test prompts, its own samples at its
temperature (logra.rl.drift.policy_drift: the exact token entropy and KL to the base)."""
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

from logra.files import progress, write_json
from logra.rl.drift import drift_prompts, policy_drift
from logra.rl.models import load

w, p, e = snakemake.wildcards, snakemake.params, snakemake.params.eval
with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    summary = json.loads(Path(snakemake.input.run).read_text())
    grpo, model = summary["config"]["grpo"], Path(snakemake.input.run).parent / "model"
    prompts = drift_prompts(snakemake.input.test, p.prompts)
    where = {"dtype": getattr(torch, e["dtype"]), "device": snakemake.config["device"]}
    base = load(p.base, **where)[0]
    policy, tokenizer = load(model, **where)
    drift = policy_drift(policy, base, tokenizer, prompts, temperature=grpo["temperature"],
                         max_new_tokens=grpo["max_new_tokens"], seed=int(w.seed),
                         batch_size=e["batch_size"])
    write_json(snakemake.output[0], {"model_dir": str(model), "step": summary["model_step"],
                                     "prompts": len(prompts), **drift})
    progress(snakemake.output[0].removeprefix("results/").removesuffix(".json"),
             entropy=drift["entropy"], kl_to_base=drift["kl_to_base"])
