"""Start-up of the workflow's jobs: the seconds each kind of job spends importing before its
first step, and the rollout engine's start (its process up, the model loaded, a first
completion back, as a GRPO run waits for it), each the median over `--repeats` fresh processes.

    python benchmarks/startup.py [--repeats 5]

Side by side in one run, interleaved round by round so machine noise hits both alike: each kind
as its jobs import (transformers' model code without scikit-learn, scipy and torchao:
logra/rl/models.py's docstring) and with transformers' model code imported first, which finds
those three as transformers does on its own; the ratio is the second over the first (kinds
without transformers, and the engine's process: as jobs only). The planner is the Snakemake
main process's (and each slurm job's) import of the Snakefile's modules. Prints one table;
nothing is written but a tiny model in a temporary folder.
"""
from __future__ import annotations

from logra.repro import pin_cpu

pin_cpu()  # the environment the workflow's CPU jobs run in (logra/repro.py)

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# what each job kind imports before its first step (workflow/scripts/*.py and the modules they
# import on first use), and whether that loads transformers' model code
KINDS = {
    "data": (["logra.files", "logra.rl.tasks"], False),
    "planner": (["snakemake.utils", "logra.harness.config", "logra.harness.plan",
                 "logra.harness.freeze"], True),
    "base (SFT)": (["torch", "logra.files", "logra.repro", "logra.rl.models", "logra.rl.sft",
                    "logra.rl.tasks"], True),
    "train": (["logra.files", "logra.rl.loop", "logra.rl.summary"], True),
    "evaluate": (["torch", "logra.files", "logra.harness.evaluate", "logra.rl.models",
                  "lm_eval", "lm_eval.models.huggingface", "lm_eval.tasks"], True),
    "memory point": (["torch", "logra.files", "logra.harness.memory_point"], True),
}
# transformers' own way: its model code loaded first, finding scikit-learn, scipy and torchao
ON_ITS_OWN = "import transformers.generation.candidate_generator, transformers.modeling_utils\n"

ENGINE = """
import sys, time
start = time.perf_counter()
from logra.rl.rollout import HFRolloutEngine
with HFRolloutEngine(sys.argv[1]) as engine:
    engine.generate(["1+1="], 2, 4, 1.0, 0)
    print(time.perf_counter() - start)
"""


def seconds(code: str, *args: str) -> float:
    """Wall seconds of a fresh `python -c code`, interpreter start included (or, for a script
    that prints a number, that number)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"startup benchmark: {code!r} failed:\n{out.stderr[-2000:]}")
    printed = out.stdout.strip().splitlines()
    return float(printed[-1]) if printed else time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from logra.rl.models import build_tiny
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny(Path(tmp) / "model", hidden_size=128, intermediate_size=256,
                               num_hidden_layers=1, num_attention_heads=2))
        codes = {kind: "import " + ", ".join(modules) + "\n" for kind, (modules, _) in
                 KINDS.items()}
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for kind, code in codes.items():
                for how, prefix in (("jobs", ""), ("own", ON_ITS_OWN)):
                    if how == "jobs" or KINDS[kind][1]:
                        times.setdefault((kind, how), []).append(seconds(prefix + code))
            times.setdefault(("rollout engine", "jobs"), []).append(seconds(ENGINE, model))
    print(f"start-up per job kind, median of {args.repeats} fresh processes (s)")
    print(f"{'kind':<16}{'as jobs':>10}{'transformers own':>18}{'ratio':>8}")
    for kind in codes:
        jobs = statistics.median(times[kind, "jobs"])
        if (kind, "own") in times:
            own = statistics.median(times[kind, "own"])
            print(f"{kind:<16}{jobs:>10.2f}{own:>18.2f}{own / jobs:>8.2f}")
        else:  # no transformers: nothing hidden
            print(f"{kind:<16}{jobs:>10.2f}")
    # the engine's own process imports as jobs do; the trainer waits for it before its first
    # rollout
    print(f"{'rollout engine':<16}{statistics.median(times['rollout engine', 'jobs']):>10.2f}")


if __name__ == "__main__":
    main()
