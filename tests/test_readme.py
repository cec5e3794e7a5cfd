"""The README's recipes as a newcomer follows them: each code block is read from README.md
verbatim and run (the workflow's recipes on the quick start's config, `config/quick.yaml`; a
dry run where one shows what used to fail)."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import ROOT
from runs import assert_tensorboard_holds_metrics

QUICK = str(ROOT / "config/quick.yaml")


def blocks(heading: str, lang: str) -> list[str]:
    """The `lang` code blocks under README heading `heading` (up to the next heading), verbatim."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(r"^#", text[start:], re.M)
    section = text[start:start + end.start()] if end else text[start:]
    return re.findall(rf"^```{lang}\n(.*?)^```$", section, re.M | re.S)


def snakemake(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The workflow in `cwd` (its working directory), as `snakemake --cores 2 <args>`."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--cores", "2", "--directory", str(cwd), *args],
                         capture_output=True, text=True, cwd=cwd, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def test_the_readme_blocks_the_tests_read_exist():
    """Each block these tests run is where they read it: a README edit that moves one fails
    here, not as a silently empty recipe."""
    assert len(blocks("## Your own task", "python")) == 1
    assert len(blocks("## Your own task", "yaml")) == 2
    assert len(blocks("### Add an update rule", "yaml")) == 1
    assert len(blocks("## Use LoGRA in your own trainer", "python")) == 1
    assert "config/quick.yaml" in (ROOT / "README.md").read_text()


@pytest.mark.e2e
@pytest.mark.slow(reason="the quick start twice: the README's own task, then a switch of task")
def test_own_task_on_the_quick_start_then_a_task_switch_leaves_no_stale_table(tmp_path):
    """The README's own task (its file and its config lines, verbatim) on the quick start
    yields summary.csv and REPORT.md of that task alone; switching the grid to another task
    rebuilds every table and the report in one run, holding only the new task's rows."""
    (tmp_path / "my_tasks.py").write_text(blocks("## Your own task", "python")[0])
    (tmp_path / "own.yaml").write_text(blocks("## Your own task", "yaml")[0])
    start = time.time()
    out = snakemake(tmp_path, "--configfile", QUICK, "own.yaml")
    print(f"quick start with the README's own task: {time.time() - start:.0f} s")
    assert "train successor/logra/seed0: ok" in out.stderr
    results = tmp_path / "results"
    for table in ("summary.csv", "accuracy.csv", "verdicts.csv"):
        assert set(pd.read_csv(results / table)["task"]) == {"successor"}, table
    assert "successor" in (results / "REPORT.md").read_text()
    assert_tensorboard_holds_metrics(results / "runs/successor/logra/seed0")  # the README's line

    (tmp_path / "switch.yaml").write_text("run_tasks: [countdown]\n")
    snakemake(tmp_path, "--configfile", QUICK, "own.yaml", "switch.yaml")
    for table in ("summary.csv", "accuracy.csv", "verdicts.csv"):
        assert set(pd.read_csv(results / table)["task"]) == {"countdown"}, table
    report = (results / "REPORT.md").read_text()
    assert "successor" not in report and "| countdown |" in report


@pytest.mark.e2e
def test_own_rule_from_its_file_plans_on_the_quick_start(tmp_path):
    """README "Add an update rule": a file and its config lines, verbatim; the dry run checks the
    rule on the model (it imports the file by its path) and plans its runs."""
    from test_rules import TOY_RULE
    (tmp_path / "my_rules.py").write_text(textwrap.dedent(TOY_RULE))
    (tmp_path / "rule.yaml").write_text(blocks("### Add an update rule", "yaml")[0])
    out = snakemake(tmp_path, "--configfile", QUICK, "rule.yaml", "-n")
    assert "results/runs/countdown/sign/seed0/summary.json" in out.stdout


@pytest.mark.e2e
def test_local_gsm8k_plans_with_the_readme_lines(tmp_path):
    """README's GSM8K from local files, verbatim but for the two paths: the dry run plans the
    grid on gsm8k (its task, its lengths)."""
    data = ROOT.parent / "shared/data/gsm8k"
    if not (data / "train.jsonl").exists():
        pytest.skip(f"no GSM8K files at {data}")
    text = blocks("## Your own task", "yaml")[1]
    text = text.replace("/data/gsm8k/", f"{data}/")
    (tmp_path / "gsm8k.yaml").write_text(text)
    out = snakemake(tmp_path, "--configfile", QUICK, "gsm8k.yaml", "-n")
    assert "results/runs/gsm8k/logra/seed0/summary.json" in out.stdout
    assert "results/runs/countdown/" not in out.stdout.split("Job stats")[0]


def test_the_trl_snippet_trains(tiny_dir, tmp_path, monkeypatch):
    """README "Use LoGRA in your own trainer": the TRL block, verbatim, with the names it leaves
    to the reader (`model`, `my_reward`, `my_prompts`, `steps`) defined, trains one step."""
    import datasets

    from logra.rl.models import load
    monkeypatch.chdir(tmp_path)  # its output_dir, "out"
    model = load(tiny_dir)[0]
    names = {"model": model, "steps": 1,
             "my_reward": lambda completions, **kwargs: [float(len(c)) for c in completions],
             "my_prompts": datasets.Dataset.from_dict({"prompt": ["1+2="] * 8})}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    exec(blocks("## Use LoGRA in your own trainer", "python")[0], names)
    assert names["trainer"].state.global_step == 1
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed and all(n.endswith("proj.weight") for n in changed)
