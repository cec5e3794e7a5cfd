"""Snakemake's dry run read back as a DAG: every job with its rule, wildcards, resources, inputs
and outputs. One dry run of several targets then answers for each of them: a target's jobs are
its rule's job and, transitively, the jobs that make their inputs (what `snakemake -n TARGET`
alone plans, in a results folder where nothing exists yet)."""
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

from conftest import ROOT

JOB = re.compile(r"^(?:(?:local)?rule|(?:local)?checkpoint) (\w+):\n((?:    .*\n)*)", re.M)


@dataclass(frozen=True)
class Job:
    rule: str
    jobid: int
    wildcards: dict
    resources: dict
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _pairs(line: str | None) -> dict:
    return dict(kv.split("=", 1) for kv in line.split(", ")) if line else {}


def parse(console: str) -> list[Job]:
    """Every job a dry run printed, its benchmark file among its outputs (REPORT.md's ledger
    asks for each job's). A job whose input waits for a checkpoint prints it as `<TBD>`; its
    reason names the checkpoints' outputs it waits for."""
    jobs = []
    for rule, body in JOB.findall(console):
        field = dict(re.findall(r"^    (\w+): (.*)$", body, re.M))
        inputs = tuple(field["input"].split(", ")) if "input" in field else ()
        if "<TBD>" in inputs:
            waits = re.search(r"Input files updated by another job: ([^;]*)", field["reason"])
            inputs = tuple(i for i in inputs if i != "<TBD>") + tuple(waits.group(1).split(", "))
        jobs.append(Job(rule, int(field["jobid"]), _pairs(field.get("wildcards")),
                        _pairs(field.get("resources")), inputs,
                        (tuple(field["output"].split(", ")) if "output" in field else ())
                        + ((field["benchmark"],) if "benchmark" in field else ())))
    return jobs


def dry_run(args: list[str], targets: list[str], cwd=None) -> tuple[list[Job], str]:
    """`snakemake -n TARGETS` with `args` (the config, the directory, an executor): its jobs
    and its console."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n",
                          *args, *targets], capture_output=True, text=True, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return parse(out.stdout), out.stdout + out.stderr


def needed(jobs: list[Job], target: str) -> list[Job]:
    """The jobs of `target` (a rule with one job, e.g. `all`, `lr_sweep`)."""
    made_by = {path: job for job in jobs for path in job.outputs}
    (root,) = [job for job in jobs if job.rule == target]
    seen, todo = {root.jobid: root}, [root]
    while todo:
        for path in todo.pop().inputs:
            job = made_by.get(path)
            if job is not None and job.jobid not in seen:
                seen[job.jobid] = job
                todo.append(job)
    return list(seen.values())


def counts(jobs: list[Job]) -> Counter:
    """Jobs per rule, as Snakemake's job stats count them."""
    return Counter(job.rule for job in jobs)
