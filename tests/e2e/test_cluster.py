"""The workflow on a real slurm cluster, through snakemake-executor-plugin-slurm and
workflow/profiles/slurm: the smoke grid, and a GRPO job cancelled mid-run.

They need a slurm whose default partition has a node up: `tests/cluster/slurm.sh start` (root,
Debian's packages) starts a one-node one on this machine, and `.ci/run` does so before the
tests. Without one they skip, saying why; under CI=true a missing cluster fails them."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from conftest import ROOT, SNAKEMAKE
from runs import weights

from logra.harness.config import job_resources, run_config, validate_file
from logra.rl.loop import train

pytestmark = pytest.mark.e2e  # README: `pytest -m "not e2e"` leaves these out

# the slurm executor as the README runs it, on the one-node cluster: no accounting database, so
# job states come from squeue; status checks from 1 s after a job ends (the plugin's default
# waits 40 s, and adds 10 s after each check in which no job ended), and each job's slurm log
# kept, to be read below
SLURM = ["--executor", "slurm", "--workflow-profile", str(ROOT / "workflow/profiles/slurm"),
         "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
         "--slurm-keep-successful-logs"]
STAGE = {"data": "data", "data_val": "data", "lmeval_task": "data", "lmeval_task_val": "data",
         "base": "base", "train": "train", "eval_run": "eval", "eval_base": "eval",
         "lr_sweep_eval": "eval", "lr_sweep_eval_base": "eval", "stability_eval": "eval",
         "memory_point": "memory", "fingerprints": "fingerprints"}
# (rule -> the stage whose resources it asks for)
# what differs between two runs of the same computation: wall and step times, RSS
TIMINGS = ("wall_s", "mean_step_time_s", "step_time_s_mean", "mem_rss_peak_bytes",
           "sync_seconds_per_step", "control_seconds")


@pytest.fixture(scope="session")  # as smoke_run's, so it is set up first, and skips first
def partition() -> str:
    """The cluster's default partition, which has a node up; skips (fails under CI=true) when
    there is none."""
    try:
        out = subprocess.run(["sinfo", "--noheader", "--format=%P %T"], capture_output=True,
                             text=True, timeout=30)
        reason = None if out.returncode == 0 else f"sinfo failed: {out.stderr.strip()}"
    except FileNotFoundError:
        reason, out = "no slurm here (sinfo not found)", None
    if reason is None:
        default = [line.split() for line in out.stdout.splitlines() if "*" in line.split()[0]]
        up = [p.rstrip("*") for p, state in default
              if state.rstrip("*~#!%$@^-") in ("idle", "mixed", "allocated", "completing")]
        reason = None if up else f"no node of slurm's default partition is up: {out.stdout!r}"
    if reason:
        reason += " (tests/cluster/slurm.sh start runs a one-node slurm here)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return up[0]


def slurm_job(job_id: str) -> dict:
    """slurmctld's record of a job (`scontrol show job`): the fields without spaces."""
    out = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True,
                         text=True, check=True).stdout
    return dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", out))


def megabytes(memory: str) -> float:
    """A memory size as slurm prints it (`1536M`, `1.50G`), in MB."""
    return float(memory[:-1]) * {"M": 1, "G": 1024, "T": 1024**2}[memory[-1]]


def submitted(console: str) -> dict[int, tuple[str, str]]:
    """{Snakemake job id: (slurm job id, slurm log)} from the plugin's lines."""
    return {int(job): (slurm, log) for job, slurm, log in re.findall(
        r"^Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+)\)\.$", console, re.M)}


def finished(console: str) -> dict[int, str]:
    """{Snakemake job id: rule} of every job the console says finished."""
    return {int(job): rule for job, rule in re.findall(
        r"^Finished jobid: (\d+) \(Rule: (\w+)\)$", console, re.M)}


def local_jobs(console: str) -> set[int]:
    """The Snakemake job ids of the jobs run beside Snakemake (`localrule ...:` on the console)."""
    return {int(job) for job in re.findall(r"^localrule \w+:\n(?:    .*\n)*?    jobid: (\d+)$",
                                           console, re.M)}


# the smallest target that sends every rule of STAGE through slurm: the smoke config's default
# target narrowed to one task and seed (18 slurm jobs: one per rule, but the 2 bases, 3 GRPO
# runs, 2 evaluations and 2 memory points the DAG and the memory figure need; the smoke grid is
# 39). Every one of its jobs is a job of the smoke grid with the same inputs, so its outputs are
# the shared local run's, bit for bit.
NARROW = "seeds: [0]\nrun_tasks: [arithmetic]\n"


@pytest.mark.slow(reason="18 jobs, each a slurm job polled by the executor")
def test_smoke_grid_on_slurm_matches_the_local_run(partition, smoke_run, tmp_path):
    """Every stage's rule through the slurm executor, on the smoke grid narrowed to one task and
    seed: every job but the Snakefile's localrules is a slurm job of its own, which slurm ran
    to completion with the host memory, wall time, CPUs and (no) GPUs the config gives its
    stage, and whose output is in slurm's log; each result equals the same job's in the shared
    local smoke run, every stage to the bit. Slow (minutes): each job is submitted, started and
    polled by slurm, which checks back at growing intervals."""
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(NARROW)
    start = time.time()
    out = subprocess.run(SNAKEMAKE + [str(narrow)] + SLURM + [
        "--default-resources", f"slurm_partition={partition}"],
        capture_output=True, text=True, timeout=1800, cwd=tmp_path)  # a hang
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-5000:]
    print(f"narrowed smoke grid on slurm: {time.time() - start:.0f} s")

    jobs, slurm_jobs, here = finished(console), submitted(console), local_jobs(console)
    assert here < set(jobs) and set(slurm_jobs) == set(jobs) - here, console[-5000:]
    # the smoke grid's default target runs the margin's validation run, as the lr sweep's
    assert {jobs[job] for job in slurm_jobs} == set(STAGE)
    assert len(slurm_jobs) == 18
    assert {"summary", "report", "planner"} <= {jobs[job] for job in here}

    config = validate_file(ROOT / "tests/data/smoke.yaml")
    asked = set()
    for job, (slurm_id, log) in slurm_jobs.items():
        rule = jobs[job]
        record, want = slurm_job(slurm_id), job_resources(config, STAGE[rule])
        assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (rule, record)
        assert record["Comment"].startswith(f"rule_{rule}"), record
        assert record["Partition"] == partition
        assert megabytes(record["MinMemoryNode"]) == want["mem_mb"], (rule, record)
        hours, minutes = divmod(want["runtime"], 60)
        assert record["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00", (rule, record)
        assert record["NumCPUs"] == str(config["threads"]), (rule, record)
        assert "gpu" not in record["TRES"], (rule, record)  # a CPU config asks for none
        assert record["StdOut"] == log
        assert f"rule {rule}:" in open(log).read(), log  # the job ran in slurm's allocation
        asked.add((want["mem_mb"], want["runtime"]))
    assert len(asked) > 1  # the stages ask for different sizes: each job got its own stage's

    # each digest (data, bases, runs' weights and metrics, evaluations) is the local run's
    key = ["stage", "name", "what"]
    slurm, local = (pd.read_csv(d / "results/fingerprints.csv") for d in (tmp_path, smoke_run))
    both = slurm.merge(local, on=key, how="left", suffixes=("", "_local"))
    assert set(slurm["stage"]) == {"data", "base", "train", "eval"} and len(slurm) > 8
    pd.testing.assert_series_equal(both["sha256"], both["sha256_local"], check_names=False)
    for table in ("summary.csv", "stability.csv"):  # the same runs' rows, timings left out
        slurm, local = (pd.read_csv(d / "results" / table) for d in (tmp_path, smoke_run))
        local = slurm[["task", "method", "seed"]].merge(local, how="left")
        columns = [c for c in local.columns if c not in TIMINGS]
        assert table != "summary.csv" or "wall_s" in local.columns  # there, and left out
        pd.testing.assert_frame_equal(slurm[columns], local[columns], obj=table)


@pytest.mark.slow(reason="a 16-step GRPO run through slurm, cancelled, resubmitted, then rerun")
def test_cancelled_grpo_job_fails_naming_its_rule_and_a_rerun_resumes(partition, smoke_run,
                                                                    tmp_path):
    """scancel of a GRPO run's slurm job after its first checkpoint: Snakemake reports the
    failed job with its rule; the same command again submits that run alone, which resumes from
    the checkpoint and ends with the weights of a run never interrupted. A run of its own, since
    it is cancelled; the smoke run's data and SFT base serve it as they are (copied, so only the
    GRPO run goes through slurm). Slow: that run goes through slurm twice and once in-process."""
    for part in ("data", "base"):
        shutil.copytree(smoke_run / "results" / part, tmp_path / "results" / part)
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    config.update(seeds=[0], tasks={"arithmetic": config["tasks"]["arithmetic"]},
                  run_methods=["dense_adam"])
    for paper_only in ("memory_sweep", "planner", "stability", "lr_sweep"):
        del config[paper_only]
    config["grpo"].update(steps=16, checkpoint_every=4)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = "results/runs/arithmetic/dense_adam/seed0"
    cmd = [sys.executable, "-m", "snakemake", f"{run}/summary.json", "-s", str(ROOT / "Snakefile"),
           "--configfile", str(path), *SLURM, "--default-resources", f"slurm_partition={partition}"]

    ckpt = tmp_path / "results/checkpoints/arithmetic/dense_adam/seed0"
    first = tmp_path / "first.log"  # the console of the run that is cancelled
    with open(first, "w") as f:
        proc = subprocess.Popen(cmd + ["--retries", "0"], cwd=tmp_path, stdout=f,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + 400
    while not list(ckpt.glob("*/state.pt")):
        assert proc.poll() is None, first.read_text()[-5000:]
        assert time.time() < deadline, "no checkpoint within 400 s"
        time.sleep(0.05)
    running = subprocess.run(["squeue", "--noheader", "--format=%i %k"], capture_output=True,
                             text=True, check=True).stdout.split("\n")
    (job_id,) = [line.split()[0] for line in running if " rule_train_" in line]
    subprocess.run(["scancel", job_id], check=True)
    assert proc.wait(timeout=300) != 0
    console = first.read_text()
    assert not (tmp_path / run / "summary.json").exists()  # cancelled before it finished
    assert re.search(r"^Error in rule train:$", console, re.M), console[-5000:]
    assert f"SLURM-job '{job_id}' failed, SLURM status is: 'CANCELLED'" in console
    assert slurm_job(job_id)["JobState"] == "CANCELLED"

    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    console = out.stdout + out.stderr
    assert out.returncode == 0, console[-5000:]
    stats = console[console.index("Job stats"):]
    assert re.search(r"^train\s+1$", stats, re.M) and re.search(r"^total\s+1$", stats, re.M)
    assert len(submitted(console)) == 1  # data and the SFT base are not redone
    summary = json.loads((tmp_path / run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 16
    assert summary["resumed_from_steps"] and summary["resumed_from_steps"][0] % 4 == 0
    assert not ckpt.exists()

    cfg = run_config(validate_file(path), "arithmetic", "dense_adam", 0)
    train(cfg, tmp_path / "results/base/arithmetic/seed0/model",
          tmp_path / "results/data/arithmetic/train.jsonl", tmp_path / "uninterrupted")
    resumed, uninterrupted = weights(tmp_path / run), weights(tmp_path / "uninterrupted")
    assert resumed.keys() == uninterrupted.keys()
    for name, w in uninterrupted.items():
        assert (resumed[name] == w).all(), name
