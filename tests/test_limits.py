"""The suite's per-test limit (tests/limits.py) on a suite of its own, run by pytester."""
import os

import pytest
from conftest import ROOT

SUITE = '''
import time

import pytest


def test_quick():
    pass


def test_over():
    time.sleep(0.3)


@pytest.mark.slow(reason="sleeps past the limit")
def test_over_marked():
    """Sleeps past the limit on purpose."""
    time.sleep(0.3)
'''


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """The plugin importable by the inner suite's own process."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]))


def test_a_call_over_the_limit_fails_unless_marked_slow(pytester, monkeypatch):
    monkeypatch.setenv("LOGRA_TEST_LIMIT_S", "0.2")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "limits")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*test_over took 0 s, over the suite's per-test limit of 0.2 s*"])


@pytest.mark.parametrize("marker", ['@pytest.mark.slow\n', '@pytest.mark.slow(reason="x")\n'])
def test_a_slow_marker_needs_a_reason_and_a_docstring(pytester, marker):
    pytester.makepyfile(test_suite=f"import pytest\n\n\n{marker}def test_it():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "limits")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_it: @pytest.mark.slow needs reason=... and a docstring*"])


@pytest.mark.parametrize("value", ["abc", "nan", "-1", "0"])
def test_a_limit_that_is_not_a_positive_number_is_refused_naming_it(pytester, monkeypatch,
                                                                     value):
    monkeypatch.setenv("LOGRA_TEST_LIMIT_S", value)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "limits")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*LOGRA_TEST_LIMIT_S={value!r}: the per-test limit must be a "
                                 "positive number of seconds*"])


def test_each_process_keeps_the_test_it_runs_for_a_whole_run_limit(pytester, monkeypatch,
                                                                    tmp_path):
    """Under LOGRA_TEST_PROGRESS (.ci/run's), a test that is stopped mid-run is named there."""
    monkeypatch.setenv("LOGRA_TEST_PROGRESS", str(tmp_path))
    pytester.makepyfile(test_suite="import os, signal\n\n\ndef test_quick():\n    pass\n\n\n"
                                   "def test_stopped():\n"
                                   "    os.kill(os.getpid(), signal.SIGKILL)\n")
    pytester.runpytest_subprocess("-p", "limits")
    (kept,) = tmp_path.iterdir()
    assert "test_suite.py::test_stopped (since " in kept.read_text()


def test_a_test_seed_that_is_not_a_seed_stops_the_suite_naming_it():
    """LOGRA_TEST_SEED (tests/conftest.py) is checked when pytest starts."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          str(ROOT / "tests/test_limits.py")], capture_output=True, text=True,
                         cwd=ROOT, env=dict(os.environ, LOGRA_TEST_SEED="x"), timeout=120)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR
    assert "LOGRA_TEST_SEED='x': a seed is an integer from 0 to 2147483647" in out.stderr
