"""Math answers graded by math-verify, bounded in time wherever the grading is called from.

`math_verify_score(gold, completion)` is 1.0 when math-verify (symbolic equivalence after
LaTeX parsing) finds the completion's answer equal to `gold`, else 0.0. It calls math-verify as
lm-eval's leaderboard MATH task and NeMo-RL's `hf_math_verify` reward do, with its defaults. A
gold answer from which math-verify extracts nothing raises `GoldError`; a completion it
extracts nothing from scores 0. math-verify runs in a worker process of its own (`python -m
logra.rl.grading`), in whose main thread its alarms work, and the caller waits at most
`timeout_s` (TIMEOUT_S) for an answer, from any thread; past it the worker is killed and the
completion scores 0.

What math-verify extracts and counts as equal, and the time bound: docs/evaluation.md.
"""
from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import os
import subprocess
import sys
import threading

TIMEOUT_S = 10.0  # one grading, waited for from the calling thread
START_TIMEOUT_S = 120.0  # the worker's start: importing sympy and math-verify


class GoldError(ValueError):
    """A gold answer math-verify cannot read."""


class _Worker:
    """math-verify in a child process, asked over a pipe whose end the child inherits."""

    def __init__(self):
        self.conn, child = mp.Pipe()
        self.proc = subprocess.Popen([sys.executable, "-m", "logra.rl.grading",
                                      str(child.fileno())], pass_fds=[child.fileno()])
        child.close()
        self.owner = os.getpid()  # a forked copy of this object is not the owner's worker
        try:
            self.answer(START_TIMEOUT_S)  # "ready", once math-verify is imported
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"math-verify's worker did not start within "
                               f"{START_TIMEOUT_S:g} s") from None
        except RuntimeError as e:
            self.kill()
            raise RuntimeError(f"math-verify's worker did not start: {e} (is math-verify "
                               "installed? pip install -r requirements.txt)") from None

    def answer(self, timeout_s: float):
        """The worker's next message; TimeoutError past `timeout_s`, RuntimeError if it died."""
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"it (pid {self.proc.pid}) exited with code "
                               f"{self.proc.wait()}; it writes to this process's file "
                               "descriptor 2") from None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


_lock = threading.Lock()
_worker: _Worker | None = None


def _forked_child() -> None:
    """In a forked child: a fresh lock (another thread may have held the parent's) and no
    worker (the parent's stays the parent's; the child starts its own when it grades)."""
    global _lock, _worker
    _lock, _worker = threading.Lock(), None


os.register_at_fork(after_in_child=_forked_child)


def _ask(op: str, gold: str, completion: str, timeout_s: float):
    """The worker's reply to (op, gold, completion); None when it ran out of time or died
    while grading. A worker found dead when asked is replaced and asked once more; a wait
    interrupted by anything else (a signal's exception, KeyboardInterrupt) kills the worker
    too before it propagates, so no reply is ever left unread for the next question."""
    global _worker
    with _lock:
        for attempt in (1, 2):
            if _worker is None:
                _worker = _Worker()
            try:
                _worker.conn.send((op, gold, completion))
            except OSError:  # it died since the last question: a fresh one, once
                _worker.kill()
                _worker = None
                if attempt == 2:
                    raise
                continue
            try:
                return _worker.answer(timeout_s)
            except (TimeoutError, RuntimeError, OSError) as e:
                _worker.kill()
                _worker = None
                reason = (f"took over {timeout_s:g} s" if isinstance(e, TimeoutError)
                          else f"failed: {e}")
                print(f"math-verify: grading {completion[:80]!r} against {gold!r} {reason}; "
                      "worker restarted", file=sys.stderr)
                return None
            except BaseException:
                _worker.kill()
                _worker = None
                raise


@atexit.register
def _stop() -> None:
    if _worker is not None and _worker.owner == os.getpid():
        _worker.kill()


def _gold_error(gold: str) -> GoldError:
    return GoldError(f"math-verify extracts no answer from the gold answer {gold!r} (read as "
                     f"\\boxed{{{gold}}}), or took longer than its 5 s to parse it")


def check_gold(gold: str, timeout_s: float = TIMEOUT_S) -> None:
    """Raise GoldError unless math-verify reads `gold` (running out of time counts as not)."""
    if _ask("check", gold, "", timeout_s) != "ok":
        raise _gold_error(gold)


@functools.lru_cache(maxsize=1 << 16)
def math_verify_score(gold: str, completion: str, timeout_s: float = TIMEOUT_S) -> float:
    """1.0 if math-verify finds the answer in `completion` equal to `gold`, else 0.0 (also when
    it extracts nothing or runs out of `timeout_s`); GoldError for a gold it cannot read.
    Remembered per (gold, completion): a reward and a reported score of one completion grade
    it once."""
    reply = _ask("grade", gold, completion, timeout_s)
    if reply == "gold":
        raise _gold_error(gold)
    return float(reply is True)


def _serve(conn) -> None:
    """The worker: answers ("check" | "grade", gold, completion) with "gold" (unreadable gold),
    "ok" (check) or whether the completion is right (grade), until the pipe closes."""
    from math_verify import LatexExtractionConfig, parse, verify

    conn.send("ready")
    while True:
        try:
            op, gold, completion = conn.recv()
        except EOFError:
            return
        parsed = parse(f"\\boxed{{{gold}}}", extraction_config=[LatexExtractionConfig()])
        if not parsed:
            conn.send("gold")
        elif op == "check":
            conn.send("ok")
        else:
            conn.send(bool(verify(parsed, parse(completion))))


if __name__ == "__main__":
    from multiprocessing.connection import Connection
    _serve(Connection(int(sys.argv[1])))
