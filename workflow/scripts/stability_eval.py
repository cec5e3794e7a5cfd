"""results/stability/{task}/{method}/seed{seed}.json: one stability run's held-out curve at step 0
(its SFT base), at each snapshot (grpo.snapshot_every) and at its last step (its saved model:
the last good one's step where it stopped early). Per point: the primary protocol on the test
split (lm-eval, seeded by the run's seed; per problem its acc and pass@k), and the policy's
drift on the first stability.prompts test prompts, its own samples at the run's temperature
(logra.rl.drift.policy_drift: exact entropy, exact KL to the SFT base)."""
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

from logra.files import progress, write_json
from logra.harness.evaluate import evaluate
from logra.rl.drift import drift_prompts, policy_drift
from logra.rl.models import load

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    torch.set_num_threads(snakemake.threads)
    e, run = snakemake.params.eval, Path(snakemake.input.run).parent
    seed = int(snakemake.wildcards.seed)
    summary = json.loads(Path(snakemake.input.run).read_text())
    grpo = summary["config"]["grpo"]
    prompts = drift_prompts(snakemake.input.test, snakemake.params.prompts)
    where = {"dtype": getattr(torch, e["dtype"]), "device": snakemake.config["device"]}
    base_model = load(snakemake.params.base, **where)[0]
    snapshots = sorted(((int(p.name.removeprefix("step")), p)
                        for p in (run / "snapshots").glob("step*")), key=lambda x: x[0])
    points = [(0, snakemake.params.base), *[(s, p) for s, p in snapshots
                                            if s < summary["model_step"]],
              (summary["model_step"], run / "model")]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for step, model in dict(points).items():  # a run that stopped at step 0: one point
            r = evaluate(model, snakemake.input.lmeval, snakemake.wildcards.task,
                         Path(tmp) / "eval.json", e["protocols"], e["primary"],
                         seed=seed, limit=e["limit"], batch_size=e["batch_size"],
                         device=snakemake.config["device"], dtype=e["dtype"],
                         backend=e["backend"], tracking=snakemake.config["tracking"])
            policy, tokenizer = load(model, **where)
            drift = policy_drift(policy, base_model, tokenizer, prompts,
                                 temperature=grpo["temperature"],
                                 max_new_tokens=grpo["max_new_tokens"], seed=seed,
                                 batch_size=e["batch_size"])
            del policy
            out.append({"step": step, "model_dir": str(model), "accuracy": r["accuracy"],
                        "n": r["n"], "metrics": r["metrics"], **drift,
                        "per_problem": {q["doc_id"]: q[e["primary"]]["acc"]
                                        for q in r["problems"]},
                        "per_problem_pass": {q["doc_id"]: q[e["primary"]]["pass"]
                                             for q in r["problems"]}})
            print(f"step {step}: {r['accuracy']:.4f}, entropy {drift['entropy']:.4f}, "
                  f"KL to base {drift['kl_to_base']:.4g} over {drift['tokens']} tokens")
    write_json(snakemake.output[0], {"primary": e["primary"], "prompts": len(prompts),
                                     "points": out})
    progress(snakemake.output[0].removeprefix("results/").removesuffix(".json"),
             **{f"{e['primary']} at step {p['step']}": p["accuracy"] for p in out})
