"""logra-repro: tasks x methods x seeds GRPO runs, lm-eval, summary table and figures.

Targets: `all` (the default grid of run_methods, the memory sweep, the planner,
stability.methods' runs (none in config/config.yaml), every figure and results/REPORT.md),
`ablations` (run_methods + ablation_methods, under results/ablations/ and figures/ablations/,
and the memory sweep's default sizes with memory_sweep.ablation_methods:
results/ablations/memory_sweep.csv), `lr_sweep` (every grid under the bracket rule:
results/lr_sweep.csv, and the choices for config/tuned.yaml: results/tuned.yaml, adopted by
`python -m logra.harness.adopt`),
`memory_large` (the memory sweep with memory_sweep.opt_in_sizes: results/memory/sweep_large.csv),
`memory_real` (the planner against each phase measured at memory_real's architecture, Qwen2.5-0.5B's
shapes: results/memory/real.csv),
`stability` (the long runs over stability.opt_in_seeds and the controller ablation, each judged
by stability.criterion: results/stability_seeds.csv, stability_controller.csv,
figures/stability_27b_seeds, figures/stability_controller), `trl`
(TRL's GRPOTrainer with LoGRA and with AdamW on each task: results/trl/{task}.json),
`sync_regime` (bf16 delta vs low-rank sync at two lr regimes: results/sync_regime.csv),
`reinforce` (reinforce_methods, the LoGRA authors' estimator, on every task and seed:
results/reinforce/, figures/reinforce/; no verdict: the plan's margins are GRPO's reference's),
`scaling_sweep` then `scaling` (each method against the reference over model sizes, tuned at
the smallest and transferred: results/scaling/, results/scaling.csv, figures/scaling), `study`
(the study's arms at each of its horizons, each tuned there on validation, over the seeds its
validation spread asks for: results/study/<horizon>/, and the horizons against each other:
results/study/horizons.csv).
"""
import os

from snakemake.utils import min_version

from logra.harness.config import resolve
from logra.harness.plan import STUDY_STABILITY, STUDY_TABLES, build_plan
from logra.repro import pin_cpu

min_version("9.0")


# config/config.yaml, then each --configfile merged over it (one with `complete: true`
# replaces what came before), then --config key=value; validated and checked
# (logra/harness/config.py), then expanded into the plan of every run, each derived run checked
# as a written one (logra/harness/plan.py); the rules built on the models by the main process
# only (a slurm job re-reads this file). The rule files read PLAN, and `config` is its config.
PLAN = build_plan(resolve(workflow.overwrite_configfiles, workflow.config_settings.config,
                          default=os.path.join(workflow.basedir, "config", "config.yaml"),
                          fit_rules=workflow.is_main_process),
                  fit_rules=workflow.is_main_process)
config.clear()
config.update(PLAN.config)
if config["device"] == "cpu" and config["reproducible"]:
    pin_cpu()  # every job started from here inherits the pinned kernels (logra/repro.py)
if config["model"]["name"] == "tiny":  # built locally: nothing may come from a hub
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


wildcard_constraints:
    task=r"[a-z][a-z0-9_]*",
    method=r"[a-z][a-z0-9_]*",
    seed=r"\d+",
    size=r"[a-z][a-z0-9_]*",
    horizon=r"h\d+",


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/base.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/memory.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/stability.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/fingerprints.smk"
include: "workflow/rules/verdicts.smk"
include: "workflow/rules/trl.smk"
include: "workflow/rules/sync_regime.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/study.smk"


report: "workflow/report/workflow.rst"  # `snakemake --report report.html` after a run


rule all:
    input:
        "results/REPORT.md",
        "results/summary.csv",
        "results/accuracy.csv",
        "results/fingerprints.csv",
        ["results/verdicts.csv"] if PLAN.verdicts else [],
        ["results/memory/sweep.csv", "results/memory/planner.csv"] if PLAN.paper else [],
        expand(
            "figures/{fig}.{ext}",
            fig=["reward_curves"]
            + (["verdicts"] if PLAN.verdicts else [])
            + (["memory_reduction", "sync_bytes"] if PLAN.paper else [])
            + (["stability_27b"] if PLAN.runs["long"] else []),
            ext=["png", "pdf"],
        ),


rule ablations:
    input:
        PLAN.stamps("ablations"),
        "results/ablations/summary.csv",
        "results/ablations/accuracy.csv",
        ["results/ablations/verdicts.csv"] if PLAN.verdicts else [],
        ["results/ablations/memory_sweep.csv"]
        if config.get("memory_sweep", {}).get("ablation_methods")
        else [],
        expand("figures/ablations/{fig}.{ext}", fig=["reward_curves"]
               + (["verdicts"] if PLAN.verdicts else []), ext=["png", "pdf"]),


rule reinforce:
    input:
        "results/reinforce/summary.csv",
        "results/reinforce/accuracy.csv",
        expand("figures/reinforce/reward_curves.{ext}", ext=["png", "pdf"]),


rule memory_large:
    input:
        "results/memory/sweep_large.csv",


rule memory_real:
    input:
        PLAN.stamps("memory_real") if config.get("memory_real") else [],


rule stability:
    input:
        PLAN.stamps("stability"),
        expand("figures/{fig}.{ext}", fig=["stability_27b_seeds"]
               + (["stability_controller"] if PLAN.runs["controller"] else []), ext=["png", "pdf"]),


rule sync_regime:
    input:
        PLAN.stamps("sync_regime"),


rule lr_sweep:
    input:
        PLAN.stamps("lr_sweep"),


rule study:
    input:
        PLAN.stamps("study") if config.get("study") else [],
        expand("figures/study_horizons.{ext}", ext=["png", "pdf"]) if config.get("study") else [],


rule scaling_sweep:
    input:
        "results/scaling/lr_sweep.csv",


rule scaling:
    input:
        PLAN.stamps("scaling"),
        "results/scaling/lr_sweep.csv",
        "results/scaling/transfer_check.csv",
        "results/scaling.csv",
        expand("figures/scaling.{ext}", ext=["png", "pdf"]),


# quick work on results already made (tables, figures, the planner's arithmetic, the report)
# runs beside Snakemake under a cluster executor: every rule that asks no resources of a stage
# (workflow/rules/common.smk `stage_resources`); every other rule's jobs are submitted
workflow.localrules(*[rule.name for rule in workflow.rules
                     if not rule.norun and "runtime" not in rule.resources])
