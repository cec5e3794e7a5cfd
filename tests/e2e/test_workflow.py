"""End to end: the real Snakefile on the smoke config (every stage, real lm-eval)."""
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import CONSOLE, ROOT, SNAKEMAKE
from dag import counts, dry_run, needed
from runs import assert_tensorboard_holds_metrics

from logra import repro
from logra.analysis.verdict import CALLS
from logra.files import read_jsonl
from logra.harness import fingerprints
from logra.harness.config import job_resources, validate_file
from logra.rl.tasks import get_task
from logra.tracking import tensorboard_scalars

pytestmark = pytest.mark.e2e  # README: `pytest -m "not e2e"` leaves these out


def test_lint_is_clean(tmp_path):
    out = subprocess.run(SNAKEMAKE + ["--lint", "--directory", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Lints for" not in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.fixture(scope="module")
def default_dag(tmp_path_factory):
    """The default config's jobs for every target, from one dry run of them all through the
    slurm executor and profile (so each job's resources are printed); no cluster is needed."""
    return dry_run(["--configfile", str(ROOT / "config/config.yaml"), "--executor", "slurm",
                    "--workflow-profile", str(ROOT / "workflow/profiles/slurm"), "--directory",
                    str(tmp_path_factory.mktemp("default_dag"))], [t for t, _ in PLANNED])[0]


# (target, {rule: jobs}) that `snakemake -n TARGET` plans on the default config
PLANNED = [
    # 1 run task x 2 run_methods x 3 seeds + the margin's validation runs of the reference
    # (seeds 13-15, their own bases); 2 sizes x 4 methods; an SFT base and its evaluation per
    # seed; no stability run (stability.methods: [])
    ("all", {"train": 6 + 3, "eval_run": 6, "base": 3 + 3, "eval_base": 3,
             "stability_eval": 0, "stability_table": 0, "stability_27b": 0,
             "lr_sweep_eval": 3, "lr_sweep_eval_base": 3, "margin": 1, "analysis_plan": 1,
             "memory_point": 8, "planner": 1, "verdicts": 1, "fingerprints": 1,
             "memory_reduction": 1, "sync_bytes": 1}),
    # the two run_methods are shared; the 20 ablation methods (LoGRA's 7 component ablations,
    # Sketch-Adam, the peers, dense AdamW on LoGRA's weights) add 3 seeds each, beside the
    # margin's validation runs; the memory sweep's 2 default sizes x (its 4 methods +
    # Sketch-Adam and the 8 peers)
    ("ablations", {"train": 22 * 3 + 3, "eval_run": 66, "ablation_summary": 1,
                   "memory_point": 2 * 13, "ablation_memory_sweep": 1}),
    # 13 methods x 6 declared points (an equal budget) x 3 seeds on the run task's validation
    # split, and each grid's first round of the bracket rule (what it adds is planned after)
    ("lr_sweep", {"data": 1, "data_val": 1, "base": 3, "train": 234, "lr_sweep_eval": 234,
                  "tuning_round": 13, "lr_sweep_table": 1, "stamp": 2}),
    # the default sizes and the opt-in ones (4 more), x 4 methods, in one table
    ("memory_large", {"memory_point": 24, "memory_sweep": 1}),
    # dense AdamW and LoGRA at Qwen2.5-0.5B's shapes, in one table
    ("memory_real", {"memory_point": 2, "memory_real_table": 1, "stamp": 1}),
    # dense AdamW and LoGRA 1,100 steps over three seeds, the controller ablation's 6 cells over
    # the same seeds (the short run among them), each run's held-out curve; the plan's margin
    # runs first, as every test evaluation
    ("stability", {"train": 6 + 18 + 3, "base": 3 + 3, "stability_eval": 24,
                   "stability_table": 2, "stability_27b_seeds": 1, "stability_controller": 1}),
    # opt-in: TRL's GRPOTrainer, LoGRA and AdamW in one job per task, from its seed-0 base
    ("trl", {"data": 1, "base": 1, "trl_grpo": 1}),
    # opt-in: the authors' REINFORCE, dense Adam and LoGRA on each task and seed, evaluated
    # after the plan (which waits for the margin's validation runs)
    ("reinforce", {"train": 6 + 3, "eval_run": 6, "eval_base": 3, "reinforce_summary": 1,
                   "reinforce_reward_curves": 1}),
    # opt-in: dense Adam (delta) and LoGRA (low_rank), bf16 engine, at 2 lr regimes, one seed
    ("sync_regime", {"data": 1, "base": 1, "train": 4, "sync_regime_table": 1}),
    # opt-in: the scaling sweep at the first size, 6 points x 2 methods x the sweep's 3 seeds,
    # each grid's first round of the bracket rule
    ("scaling_sweep", {"scaling_base": 3, "train": 36, "lr_sweep_eval": 36, "tuning_round": 2,
                       "scaling_sweep_table": 1}),
    # opt-in, once scaling.tuned holds the sweep's choices: the sweep, then 8 labelled runs x 3
    # seeds on the test split (dense, LoGRA, LoGRA's rank fraction at s0 and s2), the check's
    # 2 methods x 3 factors x 3 seeds at s1, the margin runs; the bases of every size
    ("scaling", {"scaling_base": 15, "train": 36 + 24 + 18 + 3, "eval_run": 24,
                 "lr_sweep_eval": 36 + 18 + 3, "scaling_eval_base": 9, "tuning_round": 2,
                 "scaling_sweep_table": 1, "scaling_check_table": 1, "scaling_table": 1,
                 "scaling_figure": 1}),
    # opt-in, three horizons: 200 updates' choices adopted (study.tuned), so its grids do not
    # run; 80's 2 arms x 6 points x 3 seeds do, and 1,100's screens, 2 arms x 6 points x 1 seed
    # (successive halving); the margin's runs at 200 and their bases (80's and 1,100's follow
    # their reference's choice), then each plan (the test runs are known once it is frozen),
    # its tables, the horizons' table
    ("study", {"base": 6, "train": 36 + 12 + 3, "lr_sweep_eval": 36 + 12 + 3, "tuning_round": 4,
               "study_tuned": 4, "study_plan": 3, "study_table": 3, "study_horizons": 1,
               "study_figure": 1, "study_stability": 1, "stamp": 18}),
]


@pytest.mark.parametrize("target, jobs", PLANNED)
def test_default_config_targets_resolve(default_dag, target, jobs):
    planned = counts(needed(default_dag, target))
    assert {rule: planned[rule] for rule in jobs} == jobs


PLANNED_JOBS = ROOT / "tests/data/planned_jobs.json"


def job_ids(jobs) -> list[str]:
    """Each job as "rule k=v,..." (its wildcards), sorted."""
    return sorted(f"{job.rule} {','.join(f'{k}={v}' for k, v in sorted(job.wildcards.items()))}"
                  .strip() for job in jobs)


def test_every_target_plans_the_jobs_of_the_reference(default_dag, paper_dag):
    """Every job of every target of the default config and of config/paper.yaml's default
    target equals tests/data/planned_jobs.json, job by job (rule and wildcards): a refactor
    keeps every target's jobs. A change that alters them on purpose rewrites the file
    (LOGRA_WRITE_PLANNED_JOBS=1 and this test) and says so in its commit."""
    planned = {"config/config.yaml": {t: job_ids(needed(default_dag, t)) for t, _ in PLANNED},
               "config/paper.yaml": {"all": job_ids(paper_dag[0])}}
    if os.environ.get("LOGRA_WRITE_PLANNED_JOBS"):
        PLANNED_JOBS.write_text(json.dumps(planned, indent=0) + "\n")
    assert planned == json.loads(PLANNED_JOBS.read_text())


@pytest.fixture(scope="module")
def paper_dag(tmp_path_factory):
    """config/paper.yaml's default target through snakemake-executor-plugin-slurm and the slurm
    workflow profile, dry, as the README's cluster command runs it from the repository root
    (relative paths), in a results folder of its own (no results of the checkout count): its
    jobs and console."""
    return dry_run(["--executor", "slurm", "--workflow-profile", "workflow/profiles/slurm",
                    "--configfile", "config/paper.yaml", "--directory",
                    str(tmp_path_factory.mktemp("paper_dag"))], [], cwd=ROOT)


def test_paper_config_resolves_on_slurm(paper_dag):
    """config/paper.yaml on slurm (paper.yaml is complete: config/config.yaml is not merged
    under it). The authors' run and the 27B stability runs resolve, sharded runs ask for their
    GPUs (4; a node's 8 at 27B), lm-eval for one, and each job for the host memory the config
    gives its stage; the authors' values arrive in the runs' configs."""
    import yaml
    jobs, console = paper_dag
    # the authors' run: 2 tasks x {dense AdamW, LoGRA} x 3 seeds + 2 stability methods x 3
    # seeds; hub models: no SFT base, the hub model evaluated once per seed
    assert "Config file config/config.yaml" not in console
    planned = {"train": 12 + 6, "eval_run": 12, "eval_base": 6, "memory_point": 8,
               "stability_eval": 6, "stability_27b": 1, "memory_reduction": 1, "base": 0}
    assert {rule: counts(jobs)[rule] for rule in planned} == planned
    resources = {(job.rule, job.wildcards.get("method")): job.resources for job in jobs}
    gpus = {job: r.get("gpu") for job, r in resources.items()}
    assert gpus[("train", "logra_32b")] == "8"  # a node; the authors' run: 4 training GPUs
    assert gpus[("train", "logra")] == gpus[("train", "dense_adam")] == "4"
    assert gpus[("eval_run", "logra")] == "1"
    cluster = yaml.safe_load((ROOT / "config/paper.yaml").read_text())["cluster"]
    assert resources[("train", "logra")]["mem_mb"] == str(cluster["mem_gb"]["train"] * 1024)
    assert resources[("eval_run", "logra")]["mem_mb"] == str(cluster["mem_gb"]["eval"] * 1024)
    assert "slurm" in console  # the plugin was the executor
    from logra.harness.config import resolve, run_config
    config = resolve([str(ROOT / "config/paper.yaml")], {})
    dense, logra = (run_config(config, "math", m, 0) for m in ("dense_adam", "logra"))
    assert dense["model_name"] == logra["model_name"] == "Qwen/Qwen2.5-Math-1.5B"
    for run in (dense, logra):
        g = run["grpo"]
        assert (g["estimator"], g["prompts_per_step"], g["group_size"], g["steps"],
                g["micro_batch_size"], g["gradient_checkpointing"], g["beta"]) == (
            "reinforce_baseline", 128, 1, 200, 1, True, 0.0)
        assert (g["baseline_weight"], g["failure_reward"], g["importance_cap"]) == (
            0.1, -0.01, 2.0)
    assert dense["method"]["options"] == {"lr": 1e-6, "betas": [0.9, 0.95], "eps": 1e-8,
                                          "weight_decay": 0.0}
    assert (dense["grpo"]["warmup_steps"], dense["grpo"]["decay_steps"],
            dense["grpo"]["decay_final"], dense["grpo"]["length_reference"]) == (9, 300, 0.1, 1024)
    assert logra["method"]["options"] == {"seed": 0} and logra["grpo"]["length_reference"] is None


@pytest.mark.slow(reason="a run of its own at the default config's sizes, beside another e2e test")
def test_an_overlay_of_one_key_plans_and_runs_the_default_with_it(tmp_path):
    """The README's overlay: a file holding `grpo: {steps: 2}` plans the default grid, and its
    run (SFT shortened by --config, to be quick) trains 2 steps with every other grpo key as
    config/config.yaml gives it. A run of its own: its config is the default's, not the smoke's.
    Slow: about 75 s alone, up to twice that beside another end-to-end test (`make test` runs
    two at a time)."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("grpo: {steps: 2}\n")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--configfile",
           str(overlay), "--directory", str(tmp_path)]
    plan = subprocess.run(cmd + ["-n"], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    assert re.search(r"^train\s+9$", plan.stdout, re.M)  # 6 + the margin's 3
    run = "results/runs/countdown/dense_adam/seed0/summary.json"
    out = subprocess.run(cmd + ["--cores", "2", run, "--config",
                                "sft={steps: {arithmetic: 5, countdown: 5}}"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / run).read_text())
    default = validate_file(ROOT / "config/config.yaml")
    assert summary["steps"] == 2 and summary["status"] == "ok"
    assert summary["config"]["grpo"] == default["grpo"] | default["methods"]["dense_adam"][
        "grpo"] | {"steps": 2, "profile_step": 2}


def test_complete_configs_resolve_from_the_repository_root(paper_dag, smoke_run):
    """`--configfile config/paper.yaml` (and the smoke config) as the README writes it, from the
    root, as the paper's dry run and the smoke run start: each declares `complete: true`, so the
    default's tasks do not join them."""
    assert counts(paper_dag[0])["train"] == 18
    console = (smoke_run / CONSOLE).read_text()
    stats = console[console.index("Job stats"):]
    assert re.search(r"^train\s+9$", stats, re.M) and re.search(r"^data\s+2$", stats, re.M)


def test_the_data_job_refuses_an_example_over_the_cap_naming_file_and_line(tmp_path):
    """One 100,000-character question in a local GSM8K file: the data job stops naming the
    split's file and line (a tiny model's context would be sized to it), writing nothing. A run
    of its own (one data job): its data is the bad input."""
    import yaml
    for split in ("train", "test"):
        rows = [{"question": f"q{i}" + ("x" * 100_000 if (split, i) == ("train", 2) else ""),
                 "answer": "#### 1"} for i in range(4)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    config["tasks"] = {"gsm8k": {"type": "gsm8k", "options": {
        "train_path": str(tmp_path / "train.jsonl"), "test_path": str(tmp_path / "test.jsonl")}}}
    for paper_only in ("memory_sweep", "planner", "stability", "lr_sweep"):
        del config[paper_only]
    config["methods"]["dense_adam"]["options"]["lr"] = 1.0e-4
    config["data"] = {"n_train": None, "n_test": None}
    config["sft"]["eval_examples"] = 1
    config["sft"]["batch_size"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--configfile", str(tmp_path / "config.yaml"), "--cores", "1",
                          "--directory", str(tmp_path), "results/data/gsm8k/train.jsonl"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    log = out.stdout + out.stderr  # the script's error, as Snakemake shows it
    assert re.search(r"results/data/gsm8k/train.jsonl:3: a train example of 100,\d+ characters "
                     r"\(prompt \+ target\) exceeds data.max_example_chars = 4,096 \(read from "
                     r".*train.jsonl\)", log), log[-2000:]
    assert not (tmp_path / "results/data/gsm8k/train.jsonl").exists()


def test_lr_sweep_resolves_on_slurm(default_dag):
    """The lr sweep's own rules (inherited with `use rule`) ask a cluster for what the config
    gives their stage, like the grid's: on the CPU default config, lm-eval of a sweep run asks
    for no GPU."""
    resources = {job.rule: job.resources for job in needed(default_dag, "lr_sweep")}
    config = validate_file(ROOT / "config/config.yaml")
    for rule, stage in (("lr_sweep_eval", "eval"), ("data_val", "data"), ("train", "train")):
        want = job_resources(config, stage)
        assert resources[rule]["mem_mb"] == str(want["mem_mb"]), rule
        assert resources[rule]["runtime"] == str(want["runtime"]), rule
    assert resources["lr_sweep_eval"]["gpu"] == resources["train"]["gpu"] == "0"


SCALING_OVERLAY = """
lr_sweep: {anchors: {dense_adam: 1.0e-4, logra: 2.0e-4}}
scaling:
  task: arithmetic
  methods: [dense_adam, logra]
  sizes:
    s0: {model: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
                 num_attention_heads: 2}, sft_steps: 20}
    s1: {model: {hidden_size: 64, intermediate_size: 128, num_hidden_layers: 1,
                 num_attention_heads: 2}, sft_steps: 20}
    s2: {model: {hidden_size: 128, intermediate_size: 256, num_hidden_layers: 1,
                 num_attention_heads: 2}, sft_steps: 20}
  transfer: {dense_adam: inverse_width, logra: none}
  rank_fraction: [logra]
  check: {size: s1, factors: [0.5, 1, 2]}
  cpu_hours: 2
  base_band: [0.0, 1.0]
  predict_models: {qwen2.5-32b: config/models/qwen2.5-32b.json}
"""


@pytest.mark.slow(reason="the scaling target at its smallest design: ~70 jobs")
def test_scaling_runs_every_size_from_its_own_bases(smoke_run, tmp_path):
    """`snakemake scaling_sweep` at smoke scale, beside a copy of the smoke run (its data and
    analysis plan), its choices adopted (`python -m logra.harness.adopt`, into an overlay
    here), then `snakemake scaling` (before, it stops naming scaling.tuned:
    tests/harness/test_config.py): each size's bases and runs (dense AdamW's lr moved by the
    width, LoGRA's rank fraction), the transfer's check, then results/scaling.csv with a row
    per size and compared method, the trend, the planner's ratio at 32B and the CPU time
    against the cap, and the figure. Slow: the schema's smallest design (3 sizes, 2 seeds, 3
    check factors) is still ~70 jobs, each a process that loads torch."""
    import shutil
    shutil.copytree(smoke_run / "results", tmp_path / "results")
    overlay, adopted = tmp_path / "scaling.yaml", tmp_path / "adopted.yaml"
    overlay.write_text(SCALING_OVERLAY)
    sweep = subprocess.run(SNAKEMAKE + [str(overlay), "--cores", "2",  # over the smoke config
                                        "--directory", str(tmp_path), "scaling_sweep"],
                           capture_output=True, text=True, timeout=1200)
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    records = yaml.safe_load((tmp_path / "results/scaling/tuned.yaml").read_text())
    out = subprocess.run([sys.executable, "-m", "logra.harness.adopt", "--results",
                          str(tmp_path / "results"), "--to", str(adopted), "--unbracketed",
                          "--only", "scaling", "--configfile", str(ROOT / "tests/data/smoke.yaml"), str(overlay)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "scaling.tuned.dense_adam: (new) lr " in out.stdout
    assert yaml.safe_load(adopted.read_text())["scaling"]["tuned"] == records
    out = subprocess.run(SNAKEMAKE + [str(overlay), str(adopted), "--cores", "2", "--directory",
                                      str(tmp_path), "scaling"],
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the smoke run's bases and plan serve as they are: only the sized bases are new
    jobs = out.stdout + out.stderr
    assert not re.search(r"^(local)?rule (base|eval_base|analysis_plan):", jobs, re.M)
    assert re.search(r"^(local)?rule scaling_base:", jobs, re.M)
    table = pd.read_csv(tmp_path / "results/scaling.csv")
    measured = table[table["kind"] == "measured"]
    assert list(zip(measured["size"], measured["method"])) == [
        (s, m) for s in ("s0", "s1", "s2") for m in ("logra", "logra_frac")]
    assert measured["n_params"].is_monotonic_increasing
    assert (measured["diff_lo"] <= measured["diff_mean"]).all()
    assert set(measured["call"]) <= set(CALLS) and (measured["seeds"] == 2).all()
    assert set(table[table["kind"] == "trend"]["method"]) == {"logra", "logra_frac"}
    assert (table[table["kind"] == "prediction"]["size"] == "qwen2.5-32b").all()
    cost = table[table["kind"] == "cost"].iloc[0]
    assert 0 < cost["cpu_hours"] < cost["cap_hours"]
    run = json.loads((tmp_path / "results/runs/arithmetic/dense_adam_s2/seed1/summary.json")
                     .read_text())
    assert run["config"]["method"]["options"]["lr"] == pytest.approx(
        records["dense_adam"]["value"] * 32 / 128)
    frac = json.loads((tmp_path / "results/runs/arithmetic/logra_frac_s1/seed0/summary.json")
                      .read_text())
    assert frac["config"]["method"]["options"]["rank"] == 1  # 2 of 128 -> 1 of 64
    check = pd.read_csv(tmp_path / "results/scaling/transfer_check.csv")
    assert len(check) == 2 * 3 and check.groupby("method")["chosen"].sum().eq(1).all()
    assert (tmp_path / "figures/scaling.png").stat().st_size > 0


STUDY_OVERLAY = """
lr_sweep: {seeds: [0, 1]}
methods:
  dense_adam_study: {rule: dense_adam, options: {lr: 1.0e-4}}
  logra_study: {rule: logra, options: {rank: 2, update_ratio: 3.0e-3, probe_responses: 4}}
study: {task: arithmetic, arms: {dense_adam_study: 1.0e-4, logra_study: 2.0e-4},
        reference: dense_adam_study, schedule: {warmup: 0.25, decay: 1.5, final: 0.1},
        horizons: {h4: {snapshot: 2, halving: {keep: 1}, stability: {every: 2},
                        seeds: {min: 2, max: 2, half_width: 0.02}}}}
"""


@pytest.mark.slow(reason="the study target at its smallest design: ~45 jobs")
def test_study_tunes_freezes_its_plan_then_scores_every_arm(smoke_run, tmp_path):
    """`snakemake study` at smoke scale, beside a copy of the smoke run, at one horizon (a
    second doubles the test's ~10 minutes; two horizons' jobs: the default config's planned
    jobs, their table: tests/analysis/test_study.py): each arm's grid on the validation seeds
    by successive halving (every point on seed 0, the best on seed 1 too) under the bracket
    rule and the horizon's schedule, the margin from the reference's chosen
    point on the margin seed, the plan frozen (choices, test seeds from the validation spread,
    none of them a validation or margin seed) before any test evaluation, then every arm's
    chosen point on the test seeds scored at the last update and the snapshot, the verdicts;
    the horizons' table, its figure and the report's Study sections; an adopted choice freezes
    the same plan, and a change of the plan is then refused (logra/harness/freeze.py)."""
    shutil.copytree(smoke_run / "results", tmp_path / "results")
    overlay = tmp_path / "study.yaml"
    overlay.write_text(STUDY_OVERLAY)
    for target in ("study", "all"):  # then the next run's report shows it
        out = subprocess.run(SNAKEMAKE + [str(overlay), "--cores", "2", "--directory",
                                          str(tmp_path), target],
                             capture_output=True, text=True, timeout=1500)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = tmp_path / "results/study"
    plans = {"h4": json.loads((study / "h4/analysis_plan.json").read_text())}
    records = {}
    for h, plan in plans.items():
        assert plan["horizon"] == h and plan["steps"] == dict.fromkeys(plan["arms"], int(h[1:]))
        for arm, choice in plan["arms"].items():
            name = f"{arm}_{h}"
            records |= yaml.safe_load((study / f"tuned/{name}.yaml").read_text())
            best = max(records[name]["scores"], key=lambda p: p[1])  # the grid's best point
            assert choice["value"] == records[name]["value"] == best[0]
            # halving: the screen kept one point; only the kept (and any point the bracket
            # rule added) ran on seed 1, and the choice is among them
            screen = json.loads((tmp_path / f"results/tuning/study/arithmetic/{name}/"
                                 "round0.json").read_text())
            assert screen["screen"] and len(screen["next_keep"]) == 1
            ran = {seed: len(list((tmp_path / "results/runs/arithmetic").glob(
                f"{name}_lr*/seed{seed}/summary.json"))) for seed in (0, 1)}
            assert ran == {0: len(records[name]["scores"]) + len(records[name]["screen"]),
                           1: len(records[name]["scores"])}
            assert records[name]["screen"] and records[name]["scores"]
            assert choice["method"].startswith(f"{name}_lr") and not choice["adopted"]
        # the horizon's own margin: its reference's chosen point on the margin seed
        margin = plan["margins"]["arithmetic"]
        assert margin["val_seeds"] == 1 and margin["lr"] == plan["arms"]["dense_adam_study"][
            "value"]
        assert plan["seeds_rule"]["n"] == 2 and plan["seeds"] == [3, 4]  # 0-1 chose, 2: margin
    summary = json.loads((tmp_path / "results/runs/arithmetic" / plans["h4"]["arms"][
        "dense_adam_study"]["method"] / "seed3/summary.json").read_text())
    assert summary["config"]["grpo"]["warmup_steps"] == 1  # round(0.25 x 4)
    assert summary["config"]["grpo"]["decay_steps"] == 6
    evals = list((study / "h4/eval").rglob("*.json"))
    assert len(evals) == 2 * 2 * 2  # arms x updates x seeds
    assert (study / "h4/analysis_plan.json").stat().st_mtime < min(
        p.stat().st_mtime for p in evals)
    v = pd.read_csv(study / "h4/verdicts.csv")
    assert sorted(v["step"]) == [2, 4] and set(v["method"]) == {"logra_study"}
    assert set(v["call"]) <= set(CALLS) and (v["seeds"] == 2).all()
    summary = pd.read_csv(study / "h4/summary.csv")
    assert (summary["steps"] == 4).all() and summary["step2_accuracy"].notna().all()
    assert summary["peak_mem_bytes"].gt(0).all()  # the test runs measure their peaks
    # the update's spectrum: every target matrix of every test run, at LoGRA's rank
    spectrum = pd.read_csv(study / "h4/spectrum.csv")
    assert set(zip(spectrum["method"], spectrum["seed"])) == set(zip(summary["method"],
                                                                     summary["seed"]))
    assert (spectrum["rank"] == 2).all() and spectrum["stable_rank"].ge(1).all()
    assert summary["update_stable_rank"].notna().all()
    # each test run's drift from its base at its last update: exact entropy, KL to the base,
    # here (stability judged) its curve's last point, not measured again
    assert summary["policy_entropy"].gt(0).all() and summary["kl_to_base"].ge(-1e-6).all()
    assert not (study / "h4/drift").exists()
    last = {f"arithmetic/{row['run_method']}/seed{row['seed']}": json.loads(
        (study / f"h4/curve/arithmetic/{row['run_method']}/seed{row['seed']}.json").read_text()
    )["points"][-1] for _, row in summary.iterrows()}
    assert [p["kl_to_base"] for p in last.values()] == pytest.approx(summary["kl_to_base"])
    # ... which is the drift a horizon without stability measures (study_drift), number for
    # number: one test run's
    run = next(iter(last))
    out = subprocess.run(SNAKEMAKE + [str(overlay), "--cores", "2", "--directory",
                                      str(tmp_path), f"results/study/h4/drift/{run}.json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    drift = json.loads((study / f"h4/drift/{run}.json").read_text())
    assert {k: drift[k] for k in ("entropy", "kl_to_base", "tokens")} == {
        k: last[run][k] for k in ("entropy", "kl_to_base", "tokens")}
    # stability: every test run judged on its curve (base, update 2, update 4), the arms
    # contrasted by seed on the criterion's measures
    judged = pd.read_csv(study / "h4/stability.csv")
    assert sorted(zip(judged["method"], judged["seed"])) == sorted(zip(summary["method"],
                                                                       summary["seed"]))
    assert judged["stable"].dtype == bool and judged["last_step"].eq(4).all()
    contrasts = pd.read_csv(study / "h4/stability_contrasts.csv")
    assert set(contrasts["method"]) == {"logra_study"} and "kl_to_base_last" in set(
        contrasts["measure"]) and "stable" in set(contrasts["measure"])
    # the horizons against each other: LoGRA - dense at each (one here: no horizon effect)
    across = pd.read_csv(study / "horizons.csv")
    assert list(across["horizon"]) == ["h4"] and list(across["method"]) == ["logra_study"]
    assert across["diff_mean"].iloc[0] == pytest.approx(v[v["step"] == 4]["diff_mean"].iloc[0])
    assert (tmp_path / "figures/study_horizons.png").stat().st_size > 0
    report = (tmp_path / "results/REPORT.md").read_text()
    for section in ("## Study, 4 updates: the arms", "## Study, 4 updates: verdicts at update 4",
                    "## Study, 4 updates: verdicts at update 2",
                    "## Study, 4 updates: accuracy and memory",
                    "## Study, 4 updates: the update's spectrum",
                    "## Study, 4 updates: secondary endpoints",
                    "## Study, 4 updates: stability", "## Study: the horizons"):
        assert section in report
    # every arm's choice adopted (`python -m logra.harness.adopt`, into an overlay here; a
    # smoke grid of 2 points may end on its edge) and
    # LoGRA's grid's files at h4 gone: its plan is frozen again from the config alone, no grid
    # job runs, and it is the plan the grid froze
    adopt = tmp_path / "adopt.yaml"
    out = subprocess.run([sys.executable, "-m", "logra.harness.adopt", "--results",
                          str(tmp_path / "results"), "--to", str(adopt), "--only", "study",
                          "--unbracketed", "--configfile",
                          str(ROOT / "tests/data/smoke.yaml"), str(overlay)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "study.tuned.logra_study_h4: (new) " in out.stdout
    assert yaml.safe_load(adopt.read_text())["study"]["tuned"] == records
    for gone in [*(tmp_path / "results/runs/arithmetic").glob("logra_study_h4_lr*"),
                 tmp_path / "results/tuning/study/arithmetic/logra_study_h4"]:
        shutil.rmtree(gone)
    (study / "tuned/logra_study_h4.yaml").unlink()
    out = subprocess.run(SNAKEMAKE + [str(overlay), str(adopt), "--cores", "2", "--directory",
                                      str(tmp_path), "results/study/h4/analysis_plan.json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert re.search(r"^study_plan\s+1$", console, re.M) and not re.search(
        r"^(train|tuning_round|study_tuned)\s", console[console.index("Job stats"):], re.M)
    again = json.loads((study / "h4/analysis_plan.json").read_text())
    plan = plans["h4"]
    for arm in plan["arms"]:
        assert again["arms"][arm].pop("adopted") and not plan["arms"][arm].pop("adopted")
    assert again == plan
    # its test evaluations exist: a change of the plan's half-width is refused before any job
    wider = tmp_path / "wider.yaml"
    wider.write_text("study: {horizons: {h4: {seeds: {half_width: 0.03}}}}\n")
    out = subprocess.run(SNAKEMAKE + [str(overlay), str(adopt), str(wider), "-n", "--directory",
                                      str(tmp_path), "study"], capture_output=True, text=True,
                         timeout=300)
    console = out.stdout + out.stderr
    assert out.returncode != 0 and "results/study/h4/analysis_plan.json is frozen" in console
    assert "study.seeds.half_width: 0.02 -> 0.03" in console, console[-3000:]


@pytest.mark.slow(reason="the lr sweep on the smoke run, beside another e2e test")
def test_smoke_run_end_to_end(smoke_run):
    """Every table, figure and curve of the smoke run, then the lr sweep on its results. Slow:
    the sweep's runs take about 70 s alone, up to 100 s or more beside another end-to-end test
    (`make test` runs two at a time)."""
    tmp_path = smoke_run
    summary = pd.read_csv(tmp_path / "results/summary.csv")
    assert len(summary) == 2 * 2 * 2  # tasks x methods x seeds
    assert (summary["status"] == "ok").all()
    assert summary["eval_accuracy"].between(0, 1).all()
    assert (summary["peak_mem_bytes"] > summary["pred_weights"]).all()
    acc = pd.read_csv(tmp_path / "results/accuracy.csv")
    assert set(acc["task"]) == {"arithmetic", "countdown"}
    run = tmp_path / "results/runs/countdown/dense_adam/seed1"
    metrics = pd.read_csv(run / "metrics.csv")
    assert list(metrics["step"]) == [1, 2, 3]
    s = json.loads((run / "summary.json").read_text())
    assert s["mem_check"]["agree"], s["mem_check"]
    assert s["config"]["method"]["options"]["lr"] == 2e-4  # the smoke config's countdown lr
    assert s["mem_breakdown"]["optimizer"] == s["optimizer_state_bytes"]
    assert (run / "model/config.json").exists()
    # TensorBoard (config tracking, on by default): every metrics.csv column at its steps, as
    # float32, and the evaluations' scores at the step they scored (the last; the snapshot)
    scalars = assert_tensorboard_holds_metrics(run)
    evaluated = json.loads((tmp_path / "results/eval/countdown/dense_adam/seed1.json").read_text())
    for protocol, m in evaluated["metrics"].items():
        assert scalars[f"eval/{protocol}/accuracy"][3] == np.float32(m["accuracy"]), protocol
    assert set(scalars["eval/sampled/accuracy"]) == {3}  # countdown has no stability run
    stability = tensorboard_scalars(tmp_path / "results/runs/arithmetic/dense_adam/seed0")
    assert set(stability["eval/sampled/accuracy"]) == {2, 3}  # its snapshot's, its last's
    # the divergence bounds are far from every run of the smoke grid, 50x (a diverged run would
    # be scored on its last good checkpoint and move the verdicts)
    for path in (tmp_path / "results/runs").glob("*/*/seed*/summary.json"):
        r = json.loads(path.read_text())
        g = r["config"]["grpo"]
        assert r["status"] == "ok" and r["diverged_because"] is None, path
        assert r["kl"]["max_real"] < g["max_kl_per_step"] / 50, (path, r["kl"])
        assert r["weight_norm_ratio_max"] < 1 + (g["max_weight_norm_ratio"] - 1) / 50, path
    ev = json.loads((tmp_path / "results/eval/countdown/dense_adam/seed1.json").read_text())
    assert ev["n"] == 6
    verdicts = pd.read_csv(tmp_path / "results/verdicts.csv")
    assert set(verdicts["task"]) == {"arithmetic", "countdown", "all"}
    per_task = verdicts[verdicts["task"] != "all"]
    assert set(verdicts["method"]) == {"logra"} and per_task["call"].isin(CALLS).all()
    assert (verdicts["diff_lo"] <= verdicts["diff_mean"]).all()
    assert (verdicts["metric"] == "sampled").all()  # the primary metric
    assert per_task["gate_passed"].str.fullmatch(r"[0-2]/2").all()
    for fig in ("reward_curves", "verdicts", "memory_reduction", "stability_27b", "sync_bytes"):
        for ext in ("png", "pdf"):
            assert (tmp_path / f"figures/{fig}.{ext}").stat().st_size > 1000
    sweep = pd.read_csv(tmp_path / "results/memory/sweep.csv")
    assert set(sweep["method"]) == {"dense_adam", "logra"} and (sweep["status"] == "ok").all()
    assert (sweep["planned_error"].abs() < 0.25).all()  # tiny shapes: allocator slack shows
    planner = pd.read_csv(tmp_path / "results/memory/planner.csv")
    assert set(planner["kind"]) == {"prediction"} and len(planner) == 2
    # the stability runs (the smoke config's: dense Adam on arithmetic, a snapshot at step 2),
    # each judged by the criterion on its held-out curve at the base, the snapshot and the end
    stability = pd.read_csv(tmp_path / "results/stability.csv")
    assert list(stability["seed"]) == [0, 1] and (stability["last_step"] == 3).all()
    assert stability["stable"].dtype == bool and stability["metric_base"].between(0, 1).all()
    assert (stability["spike_judged_steps"] == 2).all()  # steps 2 and 3 (min_history 1)
    assert stability["decided_by"].notna().all()
    for seed in (0, 1):
        run = tmp_path / f"results/runs/arithmetic/dense_adam/seed{seed}"
        assert [p.name for p in (run / "snapshots").iterdir()] == ["step2"]
        curve = json.loads((tmp_path / f"results/stability/arithmetic/dense_adam/seed{seed}.json")
                           .read_text())
        assert [p["step"] for p in curve["points"]] == [0, 2, 3] and curve["prompts"] == 6
        # the drift at each point: the base against itself 0, every point's entropy exact
        assert curve["points"][0]["kl_to_base"] == pytest.approx(0, abs=1e-9)
        assert all(p["entropy"] > 0 and p["tokens"] > 0 for p in curve["points"])
        assert curve["points"][-1]["model_dir"] == str(run.relative_to(tmp_path) / "model")

    # the lr sweep on the same results: its own runs (named by lr), on the validation split
    out = subprocess.run(SNAKEMAKE + ["--cores", "2", "--directory", str(tmp_path), "lr_sweep"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert re.search(r"^train\s+2$", log[log.index("Job stats"):], re.M)
    lr_sweep = pd.read_csv(tmp_path / "results/lr_sweep.csv")
    # two declared points: the choice is on an edge, so the bracket rule adds one point beyond
    # it (a second round), and stops at the cap (lr_sweep.extend: 1)
    rounds = [json.loads((tmp_path / f"results/tuning/lr_sweep/arithmetic/dense_adam/round{r}"
                                     ".json").read_text()) for r in (0, 1)]
    assert rounds[0]["window"] == [0, 1] and rounds[0]["chosen"] in (1e-4, 1e-3)
    added = 1e-5 if rounds[0]["chosen"] == 1e-4 else 1e-2
    assert rounds[0]["next"] == ([-1, 1] if added == 1e-5 else [0, 2])
    assert rounds[1]["window"] == rounds[0]["next"] and rounds[1]["next"] is None
    assert sorted(lr_sweep["lr"]) == sorted([1e-4, 1e-3, added])
    assert lr_sweep.set_index("lr")["declared"].to_dict() == {1e-4: True, 1e-3: True,
                                                              added: False}
    assert lr_sweep["chosen"].sum() == 1 and (lr_sweep["budget"] == 3).all()
    assert lr_sweep["val_accuracy_mean"].between(0, 1).all() and (lr_sweep["n_ok"] == 1).all()
    chosen = lr_sweep[lr_sweep["chosen"]].iloc[0]
    assert chosen["lr"] == rounds[1]["chosen"]
    tuned = yaml.safe_load((tmp_path / "results/tuned.yaml").read_text())["tuned"]
    assert tuned["arithmetic"]["dense_adam"] | {"scores": None} == {
        "option": "lr", "value": chosen["lr"], "bracketed": bool(chosen["bracketed"]),
        "metric": "sampled", "seeds": [0], "scores": None}
    data = tmp_path / "results/data/arithmetic"
    questions = {split: {row["question"] for row in read_jsonl(data / f"{split}.jsonl")}
                 for split in ("train", "test", "val")}
    assert len(questions["val"]) == 8
    assert not questions["val"] & (questions["train"] | questions["test"])
    val_eval = json.loads(
        (tmp_path / "results/lr_sweep/arithmetic/dense_adam_lr0p0001/seed0.json").read_text())
    assert {p["prompt"] for p in val_eval["problems"]} == {f"Q: {q}\nA: " for q in questions["val"]}


def test_smoke_run_reports_progress_and_writes_the_report(smoke_run):
    """One progress line per finished job on the console, and no known start-up noise;
    results/REPORT.md formats the CSVs' numbers and its time ledger counts every job the run ran; `snakemake --report` bundles the
    figures with captions that state the device, model size and steps."""
    console = (smoke_run / CONSOLE).read_text()
    summary = pd.read_csv(smoke_run / "results/summary.csv")
    for r in summary.itertuples():
        assert re.search(rf"^train {r.task}/{r.method}/seed{r.seed}: ok, steps 3, reward "
                         r"[-0-9.e]+, peak [0-9.]+ MiB$", console, re.M), (r, console[-2000:])
        assert re.search(rf"^eval/{r.task}/{r.method}/seed{r.seed}: sampled accuracy "
                         r"[0-9.e-]+, problems 6$", console, re.M)
        assert re.search(rf"^base {r.task}/seed{r.seed}: sft_steps 150, accuracy ", console, re.M)
    assert re.search(r"^memory s1/logra: ok, params \d+, peak [0-9.]+ MiB, planner_error ",
                     console, re.M)
    # and none of the known start-up noise (logra/noise.py), nor the profiler's native lines
    from logra.noise import LOG_NOISE
    assert not [p for _, p, _ in LOG_NOISE if re.search(p, console)]
    assert "profiler_start" not in console and "Loading weights" not in console

    report = (smoke_run / "results/REPORT.md").read_text()
    for r in pd.read_csv(smoke_run / "results/accuracy.csv").itertuples():
        sd = "n/a" if pd.isna(r.accuracy_sd) else f"{r.accuracy_sd:.3f}"
        assert f"| {r.task} | {r.method} | {r.accuracy_mean:.3f} ± {sd} |" in report
    for section in ("## Analysis plan", "## Verdicts", "## Memory sweep",
                    "## Planner predictions", "## Stability (", "## Sync (", "## Time ledger"):
        assert section in report
    margin = pd.read_csv(smoke_run / "results/margin.csv").set_index("task")
    assert margin.loc["arithmetic", "val_seeds"] == 1  # from its validation run
    assert margin.loc["countdown", "margin"] == 0.01  # not swept: the floor
    plan = json.loads((smoke_run / "results/analysis_plan.json").read_text())
    first_test_eval = min(p.stat().st_mtime for p in (smoke_run / "results/eval").rglob("*.json"))
    assert (smoke_run / "results/analysis_plan.json").stat().st_mtime < first_test_eval
    assert plan["margins"]["countdown"]["margin"] == 0.01
    ran = int(re.search(r"^total\s+(\d+)$", console, re.M).group(1))
    ledger_jobs = int(re.search(r"^\| total \| (\d+) \|", report, re.M).group(1))
    assert ledger_jobs == ran - 2  # every job but the report's own and `all`
    for stage in ("data", "base", "train", "eval", "memory", "tables", "figures"):
        assert re.search(rf"^\| {stage} \| \d+ \| [0-9.]+ \| [0-9.]+% \|$", report, re.M)
    machine = json.loads(next((smoke_run / "results/runs").glob("*/*/*/summary.json"))
                         .read_text())["machine"]
    assert machine["cpu_model"] in report

    out = subprocess.run(SNAKEMAKE + ["--directory", str(smoke_run), "--report",
                                      str(smoke_run / "report.html")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    html = (smoke_run / "report.html").read_text()
    for fig in ("reward_curves", "verdicts", "memory_reduction", "stability_27b", "sync_bytes"):
        assert f"{fig}.png" in html
    assert "REPORT.md" in html and "summary.csv" in html
    # the captions state the scale
    assert "3 GRPO steps" in html and "hidden_size 128, num_hidden_layers 1" in html


REFERENCE = ROOT / "tests/data/fingerprints"


def test_smoke_run_repeats_the_reference_fingerprints(smoke_run):
    """Every stage of the smoke run (data, SFT base, GRPO runs, lm-eval) gives the bits of the
    committed reference, made in another process and perhaps on another machine. Strict on
    the reference's own CPU type and between Intel CPUs with AVX2 (MKL's documented
    guarantee); elsewhere a difference skips, naming the first stage that differs.
    `make fingerprints` rewrites this machine's reference when the numerics change on purpose."""
    fresh = pd.read_csv(smoke_run / "results/fingerprints.csv")
    assert set(fresh["stage"]) == set(fingerprints.STAGES) and fresh["sha256"].notna().all()
    runs = sorted((smoke_run / "results/runs").glob("*/*/*/summary.json"))
    machine = json.loads(runs[0].read_text())["machine"]
    assert machine["reproducible"], machine["pinned"]  # every job ran on the pinned path
    if "avx2" in machine["cpu_flags"]:
        assert machine["torch_capability"] == "AVX2", machine
    cpu = ("cpu_vendor", "cpu_model", "cpu_flags")
    own = REFERENCE / f"smoke-{machine['cpu_vendor']}.csv"
    if os.environ.get("LOGRA_UPDATE_FINGERPRINTS"):
        REFERENCE.mkdir(exist_ok=True)
        made_on = {k: machine[k] for k in (*cpu, "torch", "transformers")}
        own.write_text(f"# made on: {json.dumps(made_on)}\n" + fresh.to_csv(index=False))
        return
    references = [own] if own.exists() else sorted(REFERENCE.glob("smoke-*.csv"))
    if not references:
        pytest.skip(f"no reference in {REFERENCE}: `make fingerprints` writes one")
    with open(references[0]) as f:
        made_on = json.loads(f.readline().removeprefix("# made on: "))
    reference = pd.read_csv(references[0], comment="#")
    diff = fingerprints.first_difference(fresh, reference)
    if diff is None:
        if fingerprints.unchecked(reference):
            warnings.warn(f"{references[0].name} holds no rows of "
                          f"{fingerprints.unchecked(reference)}: those are unchecked")
        return
    made_on["reproducible"] = True  # references are made on the pinned path
    versions = {k: (made_on[k], machine[k]) for k in ("torch", "transformers")
                if made_on[k] != machine[k]}
    uncovered = ((f"library versions differ from the reference's: {versions}" if versions
                  else None) or repro.covered(machine) or repro.covered(made_on))
    where = (f"this machine: {machine['cpu_vendor']} {machine['cpu_model']}; reference "
             f"{references[0].name}: {made_on['cpu_vendor']} {made_on['cpu_model']}")
    if not versions and (all(made_on[k] == machine[k] for k in cpu) or not uncovered):
        pytest.fail(f"{diff} ({where})")
    pytest.skip(f"{uncovered}: {diff} ({where})")


@pytest.mark.slow(reason="a workflow killed mid-run and rerun: ~20 jobs, about 100 s idle")
def test_killed_workflow_resumes_and_records_divergence(smoke_run, tmp_path):
    """kill -9 of the whole workflow mid-run (a preempted node), then the same command again:
    the run resumes from its checkpoint; a diverging method is recorded and the workflow goes on.
    A run of its own, since it is killed; the smoke run's data and SFT bases serve it as they
    are (copied, so only GRPO and what follows run). Slow: the run is started twice."""
    import shutil
    import signal
    import time

    import yaml

    for part in ("data", "base"):
        shutil.copytree(smoke_run / "results" / part, tmp_path / "results" / part)
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    config.update(seeds=[0], tasks={"arithmetic": config["tasks"]["arithmetic"]})
    for paper_only in ("memory_sweep", "planner", "stability"):
        del config[paper_only]
    config["grpo"].update(steps=8, checkpoint_every=2)
    config["methods"]["diverges"] = {"rule": "dense_adam", "options": {"lr": 1.0e30}}
    config["run_methods"] = ["dense_adam", "diverges"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--configfile",
           str(path), "--cores", "2", "--directory", str(tmp_path)]

    ckpt = tmp_path / "results/checkpoints/arithmetic/dense_adam/seed0"
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not list(ckpt.glob("*/state.pt")):
        assert proc.poll() is None, "the workflow ended before the first checkpoint"
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = tmp_path / "results/runs/arithmetic/dense_adam/seed0"
    assert not (run / "summary.json").exists()

    subprocess.run(cmd + ["--unlock"], check=True, capture_output=True)
    # a job killed after writing its outputs but before Snakemake recorded them as complete
    # leaves them marked incomplete: --rerun-incomplete reruns it (its checkpoint is no output)
    out = subprocess.run(cmd + ["--rerun-incomplete"], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "ok" and s["steps"] == 8
    assert s["resumed_from_steps"] and s["resumed_from_steps"][0] % 2 == 0
    assert not ckpt.exists()
    summary = pd.read_csv(tmp_path / "results/summary.csv").set_index("method")
    assert summary.loc["dense_adam", "status"] == "ok"
    assert summary.loc["diverges", "status"] == "diverged"
    at = summary.loc["diverges", "diverged_at_step"]  # the first step with a non-zero gradient
    assert 1 <= at <= 8 and summary.loc["diverges", "steps"] == at - 1
    acc = pd.read_csv(tmp_path / "results/accuracy.csv")
    assert list(acc["method"]) == ["dense_adam"]  # means over finished runs only


@pytest.mark.slow(reason="two tasks of its own end to end, beside another e2e test")
def test_own_task_and_local_gsm8k_each_in_one_config_line(tmp_path):
    """The README's recipe, literally, on the smoke config: a task type registered in a file of
    one's own (`task_files`) and GSM8K from local JSONL, each one line under `tasks`. A per-task
    lr that names neither stops the dry run naming the key; with a `default` they run end to
    end (one seed, one method), each base model's context sized from its own task's data, so
    lm-eval keeps every prompt whole. A run of its own: its tasks are not the smoke run's. Slow:
    about 80 s alone, up to twice that beside another end-to-end test (`make test` runs two at
    a time)."""
    import yaml

    (tmp_path / "my_tasks.py").write_text(
        "from logra.rl.tasks import SyntheticTask, register_task\n\n\n@register_task\n"
        "class Successor(SyntheticTask):\n    name = 'successor'\n\n"
        "    def generate(self, rng):\n        n = rng.randint(0, 999)\n"
        "        return {'question': f'after {n}', 'answer': str(n + 1)}\n")
    for split, n in (("train", 24), ("test", 4)):  # GSM8K's format: "... #### <number>"
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for i in range(n):
                a, b, c = i + 2, 3 * i + 1, 7
                f.write(json.dumps({
                    "question": f"Sam had {a} marbles in a box at home and bought {b} more marbles "
                                f"at the shop after school on a sunny afternoon. His friend then "
                                f"gave him {c} further marbles as a present for his birthday. "
                                f"How many marbles does Sam have now in total ({split} {i})?",
                    "answer": f"Sam had {a} and bought {b}, so {a}+{b}=<<{a}+{b}={a + b}>>"
                              f"{a + b}. Then {a + b}+{c}=<<{a + b}+{c}={a + b + c}>>"
                              f"{a + b + c}.\n#### {a + b + c}"}) + "\n")
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    for paper_only in ("memory_sweep", "planner", "stability", "lr_sweep"):
        del config[paper_only]
    config.update(seeds=[0], run_methods=["dense_adam"], task_files=["my_tasks.py"], tasks={
        "successor": {"type": "successor"},
        "gsm8k": {"type": "gsm8k", "options": {"train_path": str(tmp_path / "train.jsonl"),
                                               "test_path": str(tmp_path / "test.jsonl")}}})
    config["sft"]["steps"] = 20
    config["grpo"]["steps"] = 2
    # room for a solution and its "#### N" (the config check refuses less on the tiny model)
    config["grpo"]["max_new_tokens"] = config["eval"]["max_gen_toks"] = 96
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--configfile",
           str(path), "--cores", "2", "--directory", str(tmp_path)]
    out = subprocess.run(cmd + ["-n"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0
    assert "methods.dense_adam.options.lr: no value for 'gsm8k'" in out.stdout + out.stderr

    config["methods"]["dense_adam"]["options"]["lr"]["default"] = 1.0e-4
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "results/summary.csv")
    assert sorted(summary["task"]) == ["gsm8k", "successor"] and (summary["status"] == "ok").all()
    room = max(config["grpo"]["max_new_tokens"], config["eval"]["max_gen_toks"])
    completion = {"successor": lambda r: r["answer"], "gsm8k": get_task("gsm8k").target}
    positions = {}
    for task in ("successor", "gsm8k"):
        model = json.loads((tmp_path / f"results/base/{task}/seed0/model/config.json")
                           .read_text())
        rows = [r for split in ("train", "test")
                for r in read_jsonl(tmp_path / f"results/data/{task}/{split}.jsonl")]
        positions[task] = model["max_position_embeddings"]
        # characters are tokens; every prompt + completion + eos fits with room to generate,
        # and lm-eval, which keeps a prompt's last positions - max_gen_toks tokens, cuts none
        assert positions[task] >= max(len(r["prompt"] + completion[task](r)) + 1
                                      for r in rows) + room
        assert positions[task] - config["eval"]["max_gen_toks"] >= max(
            len(r["prompt"]) for r in rows)
    assert positions["successor"] < 256 < positions["gsm8k"]  # sized per task, not fixed


def test_an_opt_in_result_leaves_the_report_when_the_config_changes(smoke_run, tmp_path):
    """`snakemake lr_sweep` stamps results/lr_sweep.csv with the config's digest, and the next
    run rebuilds the report, which shows its table; after a config change the report is rebuilt
    and lists the table as stale, with the command that updates it, in place of showing it as
    current. A copy of the smoke run (Snakemake's records too): the sweep's other point is its
    one new run."""
    work = tmp_path / "work"
    shutil.copytree(smoke_run, work, symlinks=True)
    cmd = SNAKEMAKE + ["--cores", "2", "--directory", str(work)]
    for target in ("lr_sweep", "results/REPORT.md"):
        out = subprocess.run(cmd + [target], capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
    digest = json.loads((work / "results/stamps/lr_sweep.csv.stamp").read_text())["config_digest"]
    report = (work / "results/REPORT.md").read_text()
    assert "## lr sweep (`results/lr_sweep.csv`)" in report and "Stale" not in report
    assert f"- Config digest: `{digest}`." in report

    (tmp_path / "more_memory.yaml").write_text("cluster: {mem_gb: {default: 1.6}}\n")
    out = subprocess.run(cmd + ["results/REPORT.md", "--configfile",
                                str(ROOT / "tests/data/smoke.yaml"),
                                str(tmp_path / "more_memory.yaml")],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    report = (work / "results/REPORT.md").read_text()
    assert "## lr sweep (`results/lr_sweep.csv`)" not in report
    assert (f"| `results/lr_sweep.csv` | `{digest}` | made under another config | "
            "`snakemake --cores all lr_sweep` |"
            in report)


def test_a_summary_cut_short_stops_the_report_naming_the_run(smoke_run, tmp_path):
    """results/summary.csv cut by one line after a run: the next `snakemake` rebuilds the report
    and figures from it (it is newer), and the first of them stops naming the missing run and
    the file, in place of a report that counts one run fewer. A copy of the smoke run,
    Snakemake's records too."""
    work = tmp_path / "work"
    shutil.copytree(smoke_run, work, symlinks=True)
    summary = work / "results/summary.csv"
    lines = summary.read_text().splitlines(keepends=True)
    summary.write_text("".join(lines[:-1]))
    out = subprocess.run(SNAKEMAKE + ["--cores", "2", "--directory", str(work)],
                         capture_output=True, text=True, timeout=600)
    console = out.stdout + out.stderr
    assert out.returncode != 0, console[-3000:]
    assert re.search(r"results/summary.csv: no row for the run \S+/summary.json; remove it "
                     "and rerun snakemake", console), console[-3000:]


def test_a_frozen_plan_refuses_a_changed_margin_until_amended(smoke_run, tmp_path):
    """After test evaluations exist, a config that changes the plan (verdict.margin.fraction)
    is refused before any job, naming the key with both values, and the plan is kept; with
    `--config amend_plan=true` the plan is rewritten, the old one archived and the amendment
    listed in the new plan for the report. A copy of the smoke run, Snakemake's records too."""
    from logra.analysis.markdown import amended_lines
    work = tmp_path / "work"
    shutil.copytree(smoke_run, work, symlinks=True)
    plan = work / "results/analysis_plan.json"
    before = plan.read_text()
    overlay = tmp_path / "margin.yaml"
    overlay.write_text("verdict: {margin: {fraction: 0.25}}\n")
    cmd = SNAKEMAKE + [str(overlay), "--cores", "2", "--directory", str(work)]
    out = subprocess.run(cmd + ["-n"], capture_output=True, text=True, timeout=300)
    console = out.stdout + out.stderr
    assert out.returncode != 0, console[-3000:]
    assert "results/analysis_plan.json is frozen" in console
    assert "verdict.margin.fraction: 0.5 -> 0.25" in console
    assert plan.read_text() == before

    out = subprocess.run(cmd + ["results/analysis_plan.json", "--config", "amend_plan=true"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    amended = json.loads(plan.read_text())
    (record,) = amended["amendments"]
    assert record["changed"] == {"verdict.margin.fraction": [0.5, 0.25]}
    assert (work / record["archived"]).read_text() == before
    assert "`verdict.margin.fraction` 0.5 → 0.25" in amended_lines(amended)[0]
    out = subprocess.run(cmd + ["-n"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]  # the amended plan holds
