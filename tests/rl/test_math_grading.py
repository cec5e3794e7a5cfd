"""MATH graded by math-verify (logra/rl/grading.py): a table of hand-written MATH-style answers
(equivalent forms score 1, different ones 0), the deviations math-verify is known for, a time
bound that holds from any thread, and gold answers it cannot read.

Beside math-verify's score each row states two other graders' on the same completion
("So the answer is $\\boxed{<answer>}$."): `old`, the string tier (this project's MATH reward
before math-verify: `normalize_math` of the last boxed expression equal to the gold's), tested
here, and `authors`, the LoGRA authors' two-tier grader (skzhang1/RL,
research/logra/historical_math_grader.py: normalised strings, then sympy equality with
unreduced fractions and integers held to an exact match; with pylatexenc), found by running it
on these completions: a statement, not tested. The MATH reward is 1 where either math-verify
or the string tier says so.
"""
from __future__ import annotations

import threading
import time

import pytest

from logra.rl.grading import GoldError, check_gold, math_verify_score
from logra.rl.tasks import get_task, last_boxed, normalize_math

# gold, answer, equivalent (what math-verify scores), old, authors
TABLE = [
    # fractions
    (r"\frac{1}{2}", "1/2", 1, 0, 1),
    (r"\frac{1}{2}", "0.5", 1, 0, 1),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", 1, 0, 1),
    (r"\frac{3}{4}", r"\dfrac34", 1, 1, 1),
    (r"\frac{2}{4}", r"\frac{1}{2}", 1, 0, 0),  # authors: unreduced fractions match exactly
    (r"\dfrac{1}{4}", "0.25", 1, 0, 1),
    (r"6\frac{1}{2}", r"\frac{13}{2}", 1, 0, 1),  # a mixed number
    (r"\frac{1}{2}", r"\frac{2}{1}", 0, 0, 0),
    (r"\frac{1}{3}", "0.33", 0, 0, 0),
    # radicals
    (r"2\sqrt{3}", r"\sqrt{12}", 1, 0, 1),
    (r"\sqrt{2}", r"\sqrt2", 1, 1, 1),
    (r"\frac{\sqrt{2}}{2}", r"\frac{\sqrt2}{2}", 1, 1, 1),
    (r"\sqrt{2}", "1.414", 0, 0, 0),
    (r"3\sqrt{2}", r"2\sqrt{3}", 0, 0, 0),
    # intervals
    (r"(-\infty, 3]", r"\left(-\infty, 3\right]", 1, 1, 1),
    (r"[1,2) \cup (3,\infty)", r"[1,2)\cup(3,\infty)", 1, 1, 1),
    (r"(-\infty, 3]", r"(-\infty, 3)", 0, 0, 0),
    (r"[2, 5]", "[2,5)", 0, 0, 0),
    # tuples
    (r"(3, -1)", r"\left( 3, -1 \right)", 1, 1, 1),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)", 1, 0, 1),
    (r"(3, -1)", "(-1, 3)", 0, 0, 0),
    # units
    (r"5\text{ cm}", "5", 1, 1, 1),
    ("10", r"10\text{ meters}", 1, 1, 1),
    (r"5\text{ cm}", "6", 0, 0, 0),
    # percentages
    (r"25\%", "25", 1, 1, 1),
    (r"25\%", "0.25", 1, 0, 0),
    (r"10\%", "0.2", 0, 0, 0),
    # degrees
    (r"90^\circ", "90", 1, 1, 1),
    ("30", r"30^{\circ}", 1, 1, 1),
    (r"90^\circ", "89", 0, 0, 0),
    # negatives
    (r"-\frac{1}{2}", "-0.5", 1, 0, 1),
    (r"-\frac{1}{2}", r"\frac{-1}{2}", 1, 0, 1),
    ("-3", r"-\frac{6}{2}", 1, 0, 0),  # authors: an integer gold needs an integer answer
    ("-5", "5", 0, 0, 0),
    # decimals and numbers
    ("0.25", ".25", 1, 0, 1),
    ("3", "3.0", 1, 1, 1),
    ("1000", r"1{,}000", 1, 1, 1),
    (r"\$32,\!348", "32348", 1, 1, 1),
    ("3.14", r"\pi", 0, 0, 0),
    # sets and lists of solutions
    (r"\{1,2,3\}", r"\{3,2,1\}", 1, 0, 0),
    ("1, 2", "2, 1", 1, 0, 0),
    (r"3 \pm \sqrt{5}", r"3+\sqrt{5}, 3-\sqrt{5}", 1, 0, 0),
    (r"\{1,2\}", r"\{1,3\}", 0, 0, 0),
    # choices, expressions, equations, matrices, complex numbers, strings
    (r"\text{(C)}", "C", 1, 0, 1),
    (r"\text{(C)}", "(B)", 0, 0, 0),
    ("x^2+7x+10", "(x+2)(x+5)", 1, 0, 1),
    ("x^2+7x+10", "x^2+7x+11", 0, 0, 0),
    ("y=2x+3", "2x+3", 1, 0, 1),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 1, 0, 1),
    ("1+2i", "2i+1", 1, 0, 1),
    (r"0.\overline{3}", r"0.\overline{3}", 1, 1, 1),  # math-verify: equal strings
]

# where math-verify is wrong: gold, answer, equivalent, math-verify's score, old, authors
DEVIATIONS = [
    ("0.1", "0.10000001", 0, 1, 0, 0),  # numbers are rounded to 6 decimal places
    (r"2\pi", "6.283185", 0, 1, 0, 0),  # ... so a rounded value equals its number
    (r"0.\overline{3}", r"\frac{1}{3}", 1, 0, 0, 0),  # a repeating decimal is only a string
    # answers it cannot read, which the string tier (old) grades right: why it stays
    ("10", "10.", 1, 0, 1, 1),  # a period inside the box
    (r"\frac{3}{4}", r"\dfrac{3}{4}.", 1, 0, 1, 0),
    ("(1,2)", r"\left(1,2\right).", 1, 0, 1, 0),
    ("1000", r"1\,000", 1, 0, 1, 0),  # a thin space between thousands
]

# whole completions (how the answer is found): gold, completion, math-verify's score, old, authors
EXTRACTION = [
    ("3", "The answer is 3.", 1, 0, 1),  # no box needed (old: a box is)
    ("3", r"\boxed{2}, no: \boxed{3}", 0, 1, 1),  # several boxes are one set, {2, 3} (old: last)
    (r"\frac{3}{4}", "so \\boxed{\\frac34}.\nQ: 1+1\nA: \\boxed{2}", 0, 0, 0),  # rambling on
    ("3", "I do not know.", 0, 0, 0),  # nothing to extract: 0
    ("3", "", 0, 0, 0),
]


def boxed(answer: str) -> str:
    return f"So the answer is $\\boxed{{{answer}}}$."


def string_tier(gold: str, completion: str) -> int:
    got = last_boxed(completion)
    return int(got is not None and normalize_math(got) == normalize_math(gold))


def assert_graded(gold: str, completion: str, math_verify: int, old: int) -> None:
    """math-verify's score, the string tier's, and the MATH reward and evaluation scores."""
    task, example = get_task("math"), {"answer": gold}
    assert (math_verify_score(gold, completion), string_tier(gold, completion)) == (
        math_verify, old)
    assert task.reward(completion, example) == max(math_verify, old)
    assert task.scores(completion, example) == {"math_verify": math_verify}


@pytest.mark.parametrize("gold, answer, equivalent, old, authors", TABLE)
def test_equivalent_forms_score_one_and_others_zero(gold, answer, equivalent, old, authors):
    assert_graded(gold, boxed(answer), equivalent, old)
    assert not old or equivalent  # the string tier equates no different answers


@pytest.mark.parametrize("gold, answer, equivalent, score, old, authors", DEVIATIONS)
def test_math_verify_deviations_are_as_stated(gold, answer, equivalent, score, old, authors):
    assert score != equivalent
    assert_graded(gold, boxed(answer), score, old)


@pytest.mark.parametrize("gold, completion, score, old, authors", EXTRACTION)
def test_the_answer_is_found_as_stated(gold, completion, score, old, authors):
    assert_graded(gold, completion, score, old)


@pytest.mark.parametrize("gold", ["", r"\text{}", "  "])
def test_a_gold_answer_math_verify_cannot_read_is_an_error(gold):
    with pytest.raises(GoldError, match="extracts no answer from the gold answer"):
        check_gold(gold)
    with pytest.raises(GoldError):  # never a score, least of all 1
        math_verify_score(gold, boxed(gold))
    check_gold(r"0.\overline{3}")  # read, as a string


# math-verify's own alarms (5 s) do not end these within the 1 s bound: its comparison of a
# tower of powers, its parse of deeply nested parentheses
PATHOLOGICAL = [("1", r"\boxed{9^{9^{9^{9}}}}"),
                ("1", r"\boxed{" + "(" * 500 + "1" + ")" * 500 + "}")]


@pytest.mark.parametrize("gold, completion", PATHOLOGICAL)
def test_a_pathological_answer_is_cut_off_at_the_bound(gold, completion, capfd):
    assert math_verify_score("1", "1") == 1.0  # the worker started (its start is not graded)
    start = time.monotonic()
    assert math_verify_score(gold, completion, timeout_s=1.0) == 0.0
    assert time.monotonic() - start < 2.0  # 1 s and the kill
    assert "took over 1 s; worker restarted" in capfd.readouterr().err
    assert math_verify_score("2", boxed("2")) == 1.0  # a fresh worker grades on


def _raises(call) -> str:
    try:
        call()
    except ValueError as e:
        return str(e)
    return ""


def test_grading_from_other_threads_is_bounded_and_does_not_crash():
    """math-verify's signal-based timeouts raise off the main thread (called in this process);
    through the worker, threads grade together, a pathological answer among them, each within
    the bound."""
    from math_verify import parse

    errors = []
    thread = threading.Thread(target=lambda: errors.append(_raises(lambda: parse("$1$"))))
    thread.start()
    thread.join(30)
    assert errors and "doesn't support threaded environment" in errors[0]

    results = {}

    def grade(key, gold, completion):
        start = time.monotonic()
        results[key] = (math_verify_score(gold, completion, timeout_s=1.0),
                        time.monotonic() - start)

    jobs = {"half": (r"\frac{1}{2}", boxed("0.5")), "wrong": ("3", boxed("4")),
            "tower": PATHOLOGICAL[0]}
    threads = [threading.Thread(target=grade, args=(key, *job)) for key, job in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {k: score for k, (score, _) in results.items()} == {"half": 1.0, "wrong": 0.0,
                                                               "tower": 0.0}
    # one worker serves the threads in turn: each waits its own 1 s at most, besides the others'
    # turns and a restarted worker's start (about a second)
    assert all(seconds < 3 * 2.0 for _, seconds in results.values())


def test_a_wait_interrupted_by_an_exception_leaves_no_reply_for_the_next_question():
    """An exception raised in the caller while it waits (here a timer signal's) kills the
    worker before it propagates: the interrupted question's reply is never read as the next
    one's."""
    import signal

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert math_verify_score("11", boxed("11")) == 1.0  # the worker is up
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            math_verify_score("1", r"\boxed{9^{9^{9^{9}}}} ", timeout_s=5.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert math_verify_score("5", boxed("6")) == 0.0
    assert math_verify_score("7", boxed("7")) == 1.0


def test_a_child_forked_while_another_thread_grades_grades_on_its_own():
    """A fork while a thread of the parent holds the grading lock: the child gets a fresh lock
    and starts a worker of its own, and grades within the bound."""
    import os

    busy = threading.Thread(target=math_verify_score, args=(*PATHOLOGICAL[0], 3.0))
    busy.start()
    time.sleep(0.5)  # the thread holds the lock, waiting on the worker
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it grades right, in time
        try:
            ok = math_verify_score("12", boxed("12"), timeout_s=5.0) == 1.0
        finally:
            os._exit(0 if ok else 1)
    start = time.monotonic()
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() - start < 60:
        time.sleep(0.1)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    busy.join(30)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0
