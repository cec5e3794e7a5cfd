import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from logra.repro import pin_cpu

pin_cpu()  # before torch loads: the tests, and every process they start, compute as CPU jobs do

import fcntl  # noqa: E402
import shutil  # noqa: E402
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
    tests/e2e/test_cluster.py is compared with it). Under pytest-xdist its workers share one
    run: the first to need it runs it, and the others wait for it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's, above each worker's own
    path = root / "smoke"
    with open(root / "smoke.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (path / CONSOLE).exists():
            shutil.rmtree(path, ignore_errors=True)  # from a worker that failed
            path.mkdir()
            out = subprocess.run([sys.executable, "-m", "snakemake", "--configfile",
                                  "tests/data/smoke.yaml", "--cores", "2", "--directory",
                                  str(path)], capture_output=True, text=True, timeout=900,
                                 cwd=ROOT)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            (path / CONSOLE).write_text(out.stdout + out.stderr)
    return path


VLLM = "tests/rl/test_vllm.py"
BESIDE_LAST = "tests/e2e/test_cluster.py"  # the second scope's last: they need the smoke run
# tests of test_workflow.py in the second scope, to even the two: two runs of their own (no smoke
# run) and the killed workflow's, which reaches the smoke run after the first scope made it (a
# run here: the first scope ended 6 minutes after the second without the two; 2 minutes after
# it without the third)
BESIDE = ("tests/e2e/test_workflow.py::test_an_overlay_of_one_key_plans_and_runs_the_default",
          "tests/e2e/test_workflow.py::test_own_task_and_local_gsm8k_each_in_one_config_line",
          "tests/e2e/test_workflow.py::test_killed_workflow_resumes_and_records_divergence")


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s end-to-end part (`-n 2 --dist loadscope`) in two scopes of about equal
    time, one per worker: tests/e2e/test_workflow.py, which starts with the smoke run, and every
    other end-to-end test (with `BESIDE`), the slurm tests last (by then the smoke run they
    compare with is there; they mostly wait on the cluster's status checks). Each end-to-end
    test runs its workflow on both cores, so two at a time share them: what one leaves idle (a
    Snakemake process planning, a run on one thread, a status check's wait) the other uses.
    The vLLM tests (`-n 2 --dist loadscope` from the vLLM environment) split by class, one
    engine's tests per worker (tests/rl/test_vllm.py). (pytest-xdist's own `loadgroup` cannot
    do this under pytest 9: its group suffix no longer reaches the node id.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TwoScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(VLLM):
                return super()._split_scope(nodeid)
            return ("workflow" if nodeid.startswith("tests/e2e/test_workflow.py")
                    and not nodeid.startswith(BESIDE) else "beside")

    return TwoScopes(config, log)


def pytest_collection_modifyitems(items):
    """The slurm tests after the other end-to-end tests (`pytest_xdist_make_scheduler`)."""
    items.sort(key=lambda item: item.nodeid.startswith(BESIDE_LAST))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A small random llama-architecture model + char tokenizer saved in HF format."""
    from logra.rl.models import build_tiny
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
