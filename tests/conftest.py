import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from logra.repro import pin_cpu

pin_cpu()  # before torch loads: the tests, and every process they start, compute as CPU jobs do

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI is a gate: there the property tests draw the same examples every run (a failure found by a
# local run's fresh examples is reproduced from its printed case); tests/baselines'
# LOGRA_TEST_SEED is set by .ci/run likewise
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

pytest_plugins = ["limits", "pytester"]  # the per-test limit (tests/limits.py) and its test


def pytest_configure(config):
    """LOGRA_TEST_SEED, where set, is a seed (tests/baselines): anything else stops the run
    naming it."""
    seed = os.environ.get("LOGRA_TEST_SEED")
    if seed is not None and not (seed.isdigit() and int(seed) < 2**31):
        raise pytest.UsageError(f"LOGRA_TEST_SEED={seed!r}: a seed is an integer from 0 to "
                                f"{2**31 - 1} (tests/baselines/test_sketch_adam.py)")

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
             "--configfile", str(ROOT / "tests/data/smoke.yaml")]
CONSOLE = "console.txt"  # what the smoke run printed, beside its results


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """The smoke config's default target, run once, locally, as the README writes a complete
    config from the repository root (tests/e2e/test_workflow.py; the slurm run of
    tests/e2e/test_cluster.py is compared with it)."""
    tmp_path = tmp_path_factory.mktemp("smoke")
    out = subprocess.run([sys.executable, "-m", "snakemake", "--configfile",
                          "tests/data/smoke.yaml", "--cores", "2", "--directory", str(tmp_path)],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (tmp_path / CONSOLE).write_text(out.stdout + out.stderr)
    return tmp_path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A small random llama-architecture model + char tokenizer saved in HF format."""
    from logra.rl.models import build_tiny
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
