"""The suite's per-test limit (README, "Tests"), a pytest plugin that tests/conftest.py loads: a
test whose own call takes over LIMIT_S seconds fails unless it is marked
`@pytest.mark.slow(reason=...)` and its docstring says why. Shared fixtures, such as the smoke
run, are set up once and reported by `--durations`, not held to it. LOGRA_TEST_LIMIT_S moves the
limit on a slower machine.

Under LOGRA_TEST_PROGRESS (a folder: .ci/run sets it) each pytest process, an xdist worker too,
keeps there the test it is running, so a whole-run limit that stops the suite can name it."""
import math
import os
import time
from pathlib import Path

import pytest


def limit_s() -> float:
    """LOGRA_TEST_LIMIT_S, a positive number of seconds (120 unless set)."""
    text = os.environ.get("LOGRA_TEST_LIMIT_S", "120")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise pytest.UsageError(f"LOGRA_TEST_LIMIT_S={text!r}: the per-test limit must be a "
                                "positive number of seconds (tests/limits.py)")
    return value


LIMIT_S = 120.0  # LOGRA_TEST_LIMIT_S, read when pytest starts
PROGRESS = os.environ.get("LOGRA_TEST_PROGRESS")


def pytest_configure(config):
    global LIMIT_S
    LIMIT_S = limit_s()
    config.addinivalue_line("markers", "slow(reason): allowed over the per-test limit "
                                       "(tests/limits.py); the reason says why")


def pytest_collection_modifyitems(items):
    """A test marked slow says why: the marker's reason, and its docstring."""
    for item in items:
        slow = item.get_closest_marker("slow")
        if slow and not (slow.kwargs.get("reason") and getattr(item.function, "__doc__", None)):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow needs reason=... and a "
                                    "docstring saying why the test takes that long")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """With LOGRA_TEST_PROGRESS: the test this process runs, and since when, while it runs."""
    if not PROGRESS:
        yield
        return
    mine = Path(PROGRESS) / os.environ.get("PYTEST_XDIST_WORKER", f"pid{os.getpid()}")
    mine.write_text(f"  {item.nodeid} (since {time.strftime('%H:%M:%S')})\n")
    yield
    mine.write_text(f"  between tests, after {item.nodeid} ({time.strftime('%H:%M:%S')})\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if (call.when == "call" and report.passed and call.duration > LIMIT_S
            and item.get_closest_marker("slow") is None):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {call.duration:.0f} s, over the suite's per-test "
                           f"limit of {LIMIT_S:g} s (tests/limits.py): make it faster, or mark it "
                           "@pytest.mark.slow(reason=...) with a docstring line saying why")
