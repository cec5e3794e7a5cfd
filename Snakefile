"""logra-repro: tasks x methods x seeds GRPO runs, lm-eval, summary table and figures."""
import os

from snakemake.utils import min_version, validate

from logra.config import check

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")
check(config)
if config["model"]["name"] == "tiny":  # built locally: nothing may come from a hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TASKS, METHODS, SEEDS = list(config["tasks"]), config["run_methods"], config["seeds"]


wildcard_constraints:
    task=r"[a-z][a-z0-9_]*",
    method=r"[a-z][a-z0-9_]*",
    seed=r"\d+",


include: "workflow/rules/data.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        "results/summary.csv",
        "results/accuracy.csv",
        expand("figures/reward_curves.{ext}", ext=["png", "pdf"]),
