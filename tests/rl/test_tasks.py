"""Tests for logra.rl.tasks: splits, rewards, answer extraction, JSONL IO."""

import json
import os
import random
import re
import string
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logra.rl.tasks import (
    TASKS,
    Task,
    check_lengths,
    check_overlap,
    evaluate_expression,
    extract_number,
    get_task,
    read_jsonl,
    register_task,
    write_jsonl,
)

SYNTHETIC = ["arithmetic", "countdown", "linear"]
GSM8K_DIR = Path(os.environ.get("LOGRA_GSM8K_DIR", Path(__file__).parents[3] / "shared/data/gsm8k"))
PRINTABLE = set(string.printable) - set("\t\r\x0b\x0c")


def _write_gsm8k(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


TINY_GSM8K = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 and a bike $300. Total?", "answer": "1200+300=<<1200+300=1500>>1500\n#### 1,500"},
    {"question": "It was 2\u00b0 and fell 5\u2019. Now?", "answer": "2 - 5 = -3\n#### -3"},
]


@pytest.fixture
def tiny_gsm8k(tmp_path):
    return get_task(
        "gsm8k",
        train_path=_write_gsm8k(tmp_path / "train.jsonl", TINY_GSM8K),
        test_path=_write_gsm8k(tmp_path / "test.jsonl", TINY_GSM8K[:1]),
    )


# --- registry and options ---------------------------------------------------


def test_registry_knows_all_tasks():
    assert set(SYNTHETIC + ["gsm8k"]) <= set(TASKS)
    for name in TASKS:
        assert get_task(name).name == name


def test_unknown_task_lists_known_names():
    with pytest.raises(ValueError, match="arithmetic.*countdown"):
        get_task("nope")


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match="bogus"):
        get_task("arithmetic", bogus=1)


@pytest.mark.parametrize(
    "name, options",
    [
        ("arithmetic", {"digits": 0}),
        ("arithmetic", {"ops": "+^"}),
        ("countdown", {"ops": ""}),
        ("countdown", {"n_numbers": 0}),
        ("linear", {"a_range": (0, 0)}),
        ("linear", {"x_range": (5, 1)}),
    ],
)
def test_bad_option_values_raise(name, options):
    with pytest.raises(ValueError, match=next(iter(options))):
        get_task(name, **options)


def test_register_custom_task():
    @register_task
    class EchoTask(Task):
        name = "echo-test"

    try:
        assert isinstance(get_task("echo-test"), EchoTask)
        with pytest.raises(ValueError, match="already registered"):
            register_task(type("Other", (Task,), {"name": "echo-test"}))
    finally:
        del TASKS["echo-test"]


# --- synthetic splits -------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
def test_splits_deterministic_disjoint_and_sized(name):
    task = get_task(name)
    a, b = task.splits(seed=1, n_train=200, n_test=50), task.splits(seed=1, n_train=200, n_test=50)
    assert a == b
    assert a != task.splits(seed=2, n_train=200, n_test=50)
    assert (len(a["train"]), len(a["test"])) == (200, 50)
    train_q = {ex["question"] for ex in a["train"]}
    test_q = {ex["question"] for ex in a["test"]}
    assert len(train_q) == 200 and len(test_q) == 50 and not train_q & test_q
    # The test split does not depend on the train size.
    assert task.splits(seed=1, n_train=7, n_test=50)["test"] == a["test"]


@pytest.mark.parametrize("name", SYNTHETIC)
def test_val_split_is_disjoint_and_leaves_train_and_test_unchanged(name):
    task = get_task(name)
    seed = random.randrange(1000)
    a = task.splits(seed=seed, n_train=200, n_test=50)
    b = task.splits(seed=seed, n_train=200, n_test=50, n_val=30)
    assert a["val"] == [] and (b["train"], b["test"]) == (a["train"], a["test"]), seed
    val_q = {ex["question"] for ex in b["val"]}
    assert len(val_q) == 30, seed
    assert not val_q & {ex["question"] for ex in b["train"] + b["test"]}, seed


@pytest.mark.parametrize("name", SYNTHETIC)
def test_gold_scores_one_and_wrong_scores_zero(name):
    task = get_task(name)
    for ex in sum(task.splits(seed=0, n_train=300, n_test=100).values(), []):
        assert ex["prompt"] == task.prompt(ex) and ex["prompt"].startswith("Q: ")
        assert set(ex["prompt"] + task.target(ex)) <= PRINTABLE
        assert task.reward(task.target(ex), ex) == 1.0
        assert task.reward(ex["answer"], ex) == 1.0
        assert task.reward(task.target(ex) + "\nQ: 1+1\nA: 2", ex) == 1.0
        assert task.reward("", ex) == 0.0
        assert task.reward("not an answer", ex) == 0.0


def test_numeric_rewards_compare_numbers():
    arithmetic = {"question": "12+34", "answer": "46"}
    task = get_task("arithmetic")
    for good in ["46", " 46.0", "12+34=46", "46\n47", "\n46."]:
        assert task.reward(good, arithmetic) == 1.0, good
    for bad in ["47", "4 6", "47\n46", "-46", "460"]:
        assert task.reward(bad, arithmetic) == 0.0, bad
    linear = {"question": "3x+20=5", "answer": "-5"}
    assert get_task("linear").reward("x=-5", linear) == 1.0
    assert get_task("linear").reward("5", linear) == 0.0


def test_arithmetic_ops_and_digits():
    task = get_task("arithmetic", digits=3, ops="+-*")
    examples = task.splits(seed=0, n_train=300, n_test=0)["train"]
    assert {op for ex in examples for op in "+-*" if op in ex["question"]} == set("+-*")
    for ex in examples:
        a, b = (int(x) for x in ex["question"].replace("-", " ").replace("+", " ").replace("*", " ").split())
        assert 100 <= a <= 999 and 100 <= b <= 999 and int(ex["answer"]) >= 0


def test_small_question_space_raises_instead_of_looping():
    task = get_task("arithmetic", digits=1)  # only 81 distinct questions
    assert len(task.splits(seed=0, n_train=60, n_test=21)["train"]) == 60
    with pytest.raises(ValueError, match="distinct questions"):
        task.splits(seed=0, n_train=60, n_test=22)
    with pytest.raises(ValueError, match="distinct questions.*n_val"):
        task.splits(seed=0, n_train=60, n_test=11, n_val=11)


def test_linear_question_format():
    task = get_task("linear", a_range=(-1, 1), b_range=(0, 0), x_range=(-3, 3))
    for ex in task.splits(seed=0, n_train=5, n_test=5)["train"]:
        lhs, rhs = ex["question"].split("=")
        assert lhs in ("x", "-x")
        assert int(rhs) == (-1 if lhs == "-x" else 1) * int(ex["answer"])


# --- countdown --------------------------------------------------------------

CD = {"question": "3 5 7 -> 22", "answer": "3*5+7", "numbers": [3, 5, 7], "target": 22}


@pytest.mark.parametrize("completion", ["3*5+7", "7+5*3", " (5*3)+7 \nmore text", "7+3*5=22", "5 * 3 + 7 = 22", "((7)+(3*5))"])
def test_countdown_valid_solutions(completion):
    assert get_task("countdown").reward(completion, CD) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "22",  # a number that is not given
        "3*5+7+0",
        "7+7+7+1",  # reuses 7 more often than given
        "3*5+7+3-3",
        "3*5+6",  # wrong value
        "3*5+",
        "-(3-5)*7+8",  # unary minus is not allowed
        "3**5",
        "__import__('os').system('echo hi')",
        "(" * 10_000 + "3" + ")" * 10_000,
        "9" * 100_000,
        "",
        "\n\n",
        "3*5\u00d77",
    ],
)
def test_countdown_invalid_solutions(completion):
    assert get_task("countdown").reward(completion, CD) == 0.0


def test_countdown_numbers_may_be_left_unused():
    ex = {"question": "4 6 9 -> 24", "answer": "4*6", "numbers": [4, 6, 9], "target": 24}
    assert get_task("countdown").reward("4*6", ex) == 1.0
    assert get_task("countdown").reward("6*4*1", ex) == 0.0


def test_countdown_division_is_exact():
    ex = {"question": "7 3 3 -> 8", "answer": "", "numbers": [7, 3, 3], "target": 8}
    task = get_task("countdown")
    assert task.reward("(7/3+3)*3-8", ex) == 0.0  # uses 8, not given
    assert task.reward("7/3*3+1", {**ex, "numbers": [7, 3, 3, 1]}) == 1.0  # 7/3*3 is exactly 7
    assert task.reward("7/3+3", ex) == 0.0  # 16/3, not rounded
    assert task.reward("7/(3-3)", ex) == 0.0  # division by zero
    assert evaluate_expression("7/3") == (Fraction(7, 3), [7, 3])


def test_countdown_with_division_generates_integer_targets():
    task = get_task("countdown", n_numbers=4, max_number=12, ops="+-*/")
    for ex in task.splits(seed=3, n_train=200, n_test=0)["train"]:
        assert isinstance(ex["target"], int) and ex["target"] >= 1
        assert task.reward(ex["answer"], ex) == 1.0


def test_evaluate_expression_rejects_long_input():
    assert evaluate_expression("1+" * 31 + "1") is not None  # 63 chars
    assert evaluate_expression("1+" * 32 + "1") is None  # 65 chars


# --- extract_number ---------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 72", "72"),
        ("She has 5 + 3 = 8 left.\n#### 8", "8"),
        ("#### 7\n\nQ: next question with 99", "7"),
        ("A: 18", "18"),
        ("The answer is $1,234.50.", "1234.5"),
        ("The answer is 18. Check: 18/2 = 9", "18"),
        ("answer: -4", "-4"),
        ("So she makes 18.", "18"),
        ("18.0", "18"),
        ("007", "7"),
        ("-0", "0"),
        ("The temperature is -5 degrees", "-5"),
        ("10-4 is 6 and 7-3", "3"),
        ("first 3 then 4 finally 12", "12"),
        ("1,000,000 dollars", "1000000"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


# --- GSM8K ------------------------------------------------------------------


def test_gsm8k_tiny_file(tiny_gsm8k):
    splits = tiny_gsm8k.splits(seed=0, n_train=None, n_test=None)
    assert [ex["answer"] for ex in splits["train"]] == ["7", "1500", "-3"]
    assert len(splits["test"]) == 1
    for ex in splits["train"]:
        assert ex["solution"] in [row["answer"] for row in TINY_GSM8K]
        assert set(ex["prompt"] + tiny_gsm8k.target(ex)) <= PRINTABLE
        assert "<<" not in tiny_gsm8k.target(ex)
        for gold in (ex["solution"], ex["answer"], tiny_gsm8k.target(ex)):
            assert tiny_gsm8k.reward(gold, ex) == 1.0
    ex = splits["train"][1]
    assert tiny_gsm8k.reward("Total is 1500.00 dollars.", ex) == 1.0
    assert tiny_gsm8k.reward("#### 1,501", ex) == 0.0
    assert tiny_gsm8k.scores(ex["solution"], ex) == {"math_verify": 1.0}
    truncated = tiny_gsm8k.splits(seed=0, n_train=2, n_test=0)
    assert (len(truncated["train"]), len(truncated["test"])) == (2, 0)
    val = tiny_gsm8k.splits(seed=0, n_train=1, n_test=0, n_val=2)
    assert val["train"] + val["val"] == splits["train"] and len(val["val"]) == 2
    with pytest.raises(ValueError, match=r"n_train=2 \+ n_val=2 exceeds the 3 train rows"):
        tiny_gsm8k.splits(seed=0, n_train=2, n_test=0, n_val=2)
    with pytest.raises(ValueError, match="n_val=1 needs n_train"):
        tiny_gsm8k.splits(seed=0, n_train=None, n_test=0, n_val=1)


def test_gsm8k_reports_math_verify_beside_its_exact_match():
    """The reward reads "#### N" first; math-verify an answer after "the answer is" first."""
    task, completion = get_task("gsm8k"), "The answer is 5.\n#### 6"
    assert task.extra_scores == ("math_verify",) and get_task("arithmetic").extra_scores == ()
    six, five = ({"question": "q", "answer": n, "solution": f"#### {n}"} for n in ("6", "5"))
    assert (task.reward(completion, six), task.scores(completion, six)) == (
        1.0, {"math_verify": 0.0})
    assert (task.reward(completion, five), task.scores(completion, five)) == (
        0.0, {"math_verify": 1.0})
    assert get_task("arithmetic").scores("12", {"answer": "12"}) == {}


def test_gsm8k_real_data():
    test_file, train_file = GSM8K_DIR / "test.jsonl", GSM8K_DIR / "train.jsonl"
    if not test_file.exists():
        pytest.skip(f"GSM8K data not found at {GSM8K_DIR} (set LOGRA_GSM8K_DIR)")
    task = get_task("gsm8k", train_path=train_file if train_file.exists() else test_file, test_path=test_file)
    splits = task.splits(seed=0, n_train=None, n_test=None)
    assert len(splits["test"]) == sum(1 for line in test_file.open() if line.strip())
    assert check_overlap(splits, {}) == []  # GSM8K's test questions are none of its train's
    for ex in splits["train"] + splits["test"]:
        assert extract_number(ex["solution"]) == ex["answer"]
        assert task.reward(ex["solution"], ex) == 1.0
        assert task.reward(task.target(ex), ex) == 1.0
        assert set(ex["prompt"]) <= PRINTABLE


def test_held_out_questions_that_repeat_train_or_their_own_split_are_refused(tmp_path):
    """GSM8K-format files whose 4 test rows are all train rows: the data job's check counts
    them and names the first line of each file; a test row repeated within test too. With
    data.allow_overlap the same report is returned for the log instead."""
    rows = [{"question": f"Sam has {i} apples. How many?", "answer": f"#### {i}"}
            for i in range(6)]
    extra = {"question": "Sam has 9 pears. How many?", "answer": "#### 9"}
    task = get_task("gsm8k", train_path=_write_gsm8k(tmp_path / "train.jsonl", rows),
                    test_path=_write_gsm8k(tmp_path / "test.jsonl", rows[2:] + [extra, extra]))
    splits = task.splits(seed=0, n_train=None, n_test=None)
    files = {"train": "out/train.jsonl", "test": "out/test.jsonl"}
    report = (r"out/test.jsonl: 5 of 6 test questions repeat earlier ones \(4 from train, 1 from "
              r"test; first: line 1, as out/train.jsonl:\d\)")
    with pytest.raises(ValueError, match=report + ": remove them .* data.allow_overlap: true"):
        check_overlap(splits, files)
    (kept,) = check_overlap(splits, files, allow=True)
    assert re.fullmatch(report, kept)
    distinct = get_task("arithmetic").splits(0, 40, 6, 8)
    assert check_overlap(distinct, files) == []


def test_gsm8k_missing_field(tmp_path):
    path = _write_gsm8k(tmp_path / "bad.jsonl", [TINY_GSM8K[0], {"question": "q?"}])
    task = get_task("gsm8k", train_path=path, test_path=path)
    with pytest.raises(ValueError, match=r"bad\.jsonl:2.*'answer'"):
        task.splits(seed=0, n_train=None, n_test=None)


def test_gsm8k_missing_final_answer(tmp_path):
    path = _write_gsm8k(tmp_path / "bad.jsonl", [{"question": "q?", "answer": "it is 4"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:1.*####"):
        get_task("gsm8k", train_path=path, test_path=path).splits(seed=0, n_train=None, n_test=None)


def test_gsm8k_empty_split(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    task = get_task("gsm8k", train_path=tmp_path / "empty.jsonl", test_path=tmp_path / "empty.jsonl")
    with pytest.raises(ValueError, match=r"empty\.jsonl.*empty"):
        task.splits(seed=0, n_train=None, n_test=None)


# --- MATH -------------------------------------------------------------------

TINY_MATH = [
    {"problem": "What is $\\frac{1}{2}+\\frac{1}{4}$?",
     "solution": "We get $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\dfrac{3}{4}}$.", "level": "Level 1"},
    {"problem": "Solve $x^2=4$ for $x>0$.", "solution": "So $x=\\boxed{2}$.", "level": "Level 1"},
    {"problem": "Find the set.", "solution": "It is $\\boxed{\\{1, \\{2\\}\\}}$.",
     "level": "Level 2"},
]


def test_math_file_answers_and_reward(tmp_path):
    path = tmp_path / "math.jsonl"
    write_jsonl(path, TINY_MATH)
    task = get_task("math", train_path=path, test_path=path)
    assert task.eval_until == () and get_task("arithmetic").eval_until == ("\n",)
    ex = task.splits(seed=0, n_train=None, n_test=2)
    assert [e["answer"] for e in ex["train"]] == ["\\dfrac{3}{4}", "2", "\\{1, \\{2\\}\\}"]
    assert len(ex["test"]) == 2 and "\\boxed{}" in ex["train"][0]["prompt"]
    first, second, nested = ex["train"]
    for e in ex["train"]:
        assert task.reward(task.target(e), e) == 1.0  # the solution itself scores
    assert task.reward("so \\boxed{\\frac34}.", first) == 1.0  # \dfrac / \frac34 / spacing
    assert task.reward("\\boxed{ \\tfrac{3}{4} }", first) == 1.0
    assert task.reward("\\boxed{3/5}", first) == 0.0
    assert task.reward("the answer is 3/4", first) == 1.0  # math-verify needs no box
    assert task.reward("\\boxed{2.0}", second) == 1.0 and task.reward("\\boxed{-2}", second) == 0.0
    assert task.reward("\\boxed{\\{1,\\{2\\}\\}}", nested) == 1.0  # balanced braces
    assert task.reward("no answer", second) == 0.0  # nothing math-verify can read: 0


@pytest.mark.parametrize("got, gold, score", [
    ("\\$5.00", "5", 1), ("5\\text{ cm}", "5", 1), ("1{,}000", "1000", 1),
    ("\\sqrt2", "\\sqrt{2}", 1), ("\\left( 1, 2 \\right)", "(1,2)", 1), ("90^\\circ", "90", 1),
    ("25\\%", "25", 1), ("\\text{(B)}", "(B)", 1), ("\\dfrac{3}{4}.", "\\frac34", 1),
    ("5", "6", 0), ("\\frac{3}{4}", "\\frac{4}{3}", 0), ("x^2", "x^3", 0), ("(1,2)", "[1,2]", 0),
])
def test_math_reward_keeps_its_cases(got, gold, score):
    """The MATH reward's cases from before math-verify, still graded alike (by math-verify or
    the string tier; tests/rl/test_math_grading.py holds the table of forms)."""
    assert get_task("math").reward(f"so \\boxed{{{got}}}", {"answer": gold}) == score


def test_math_row_without_boxed_answer_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [TINY_MATH[0], {"problem": "p", "solution": "no box"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'solution' has no \\boxed"):
        get_task("math", train_path=path, test_path=path).splits(0, None, None)


def test_math_row_whose_answer_math_verify_cannot_read_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [TINY_MATH[0], TINY_MATH[1], {"problem": "p", "solution": "So \\boxed{}."}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: field 'solution': math-verify extracts "
                                         r"no answer from the gold answer ''"):
        get_task("math", train_path=path, test_path=path).splits(0, None, None)


# --- JSONL IO ---------------------------------------------------------------


def test_jsonl_roundtrip_is_atomic(tmp_path):
    rows = [{"a": 1, "s": "x\ny \u00e9"}, {"b": [1, 2]}]
    path = tmp_path / "sub" / "rows.jsonl"
    write_jsonl(path, rows)
    assert read_jsonl(path) == rows
    assert os.listdir(path.parent) == ["rows.jsonl"]  # no temp file left behind

    def failing_rows():
        yield {"new": 1}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(path, failing_rows())
    assert read_jsonl(path) == rows and os.listdir(path.parent) == ["rows.jsonl"]


def test_read_jsonl_malformed_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:3"):
        read_jsonl(path)


def test_read_jsonl_non_object(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"list\.jsonl:2.*object"):
        read_jsonl(path)


def test_read_jsonl_missing_required_field(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "Q: 1+1\\nA: ", "answer": "2"}\n{"prompt": "Q: 2+2\\nA: "}\n')
    with pytest.raises(ValueError, match=r"train\.jsonl:2: missing field 'answer'"):
        read_jsonl(path, required=("prompt", "answer"))
    assert len(read_jsonl(path)) == 2


def test_non_utf8_byte_is_named_with_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "1+1", "answer": "2"}\n{"question": "caf\xe9", "answer": "3"}\n')
    with pytest.raises(ValueError, match=r"train\.jsonl:2: not UTF-8 \(byte 0xe9 at column 18\)"):
        read_jsonl(path)


def test_an_example_longer_than_the_cap_is_named_with_file_and_line(tmp_path):
    for split, question in (("train", "x" * 100_000), ("test", "1+1")):
        rows = [{"question": "2+2", "answer": "#### 4"}, {"question": question,
                                                          "answer": "#### 2"}]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task("gsm8k", train_path=tmp_path / "train.jsonl",
                    test_path=tmp_path / "test.jsonl")
    splits = task.splits(0, None, None)
    with pytest.raises(ValueError, match=r"out/train\.jsonl:2: a train example of 100,0\d\d "
                                         r"characters .* exceeds data\.max_example_chars = "
                                         r"4,096 \(read from .*train\.jsonl\)"):
        check_lengths(task, splits, 4096, {"train": "out/train.jsonl"})
    check_lengths(task, splits, 200_000, {})  # under the cap: nothing to say


def test_read_jsonl_empty_file(tmp_path):
    path = tmp_path / "nothing.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match=r"nothing\.jsonl.*empty"):
        read_jsonl(path)


# --- properties -------------------------------------------------------------

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_EXAMPLES = {name: get_task(name).splits(seed=0, n_train=1, n_test=0)["train"][0] for name in SYNTHETIC}
_GSM8K_EXAMPLE = {"question": "q", "answer": "18", "solution": "#### 18"}
_MATH_EXAMPLE = {"question": "q", "answer": "\\frac{3}{4}", "solution": "\\boxed{\\frac{3}{4}}"}
_ARITHY = st.text(alphabet="0123456789+-*/()=. \n$,#:answerisA", max_size=80)


@PROPERTY
@given(text=st.one_of(st.text(), _ARITHY))
def test_rewards_never_raise(text):
    for name, ex in _EXAMPLES.items():
        assert get_task(name).reward(text, ex) in (0.0, 1.0)
    assert get_task("gsm8k").reward(text, _GSM8K_EXAMPLE) in (0.0, 1.0)
    assert get_task("math").reward(text, _MATH_EXAMPLE) in (0.0, 1.0)


@PROPERTY
@given(text=st.one_of(st.text(), _ARITHY))
def test_extract_number_never_raises(text):
    number = extract_number(text)
    assert number is None or extract_number(number) == number  # canonical form is a fixed point


@PROPERTY
@given(a=st.integers(-(10**30), 10**30), frac=st.integers(0, 10**6))
def test_extract_number_is_exact(a, frac):
    assert extract_number(f"x = {a}.{frac}") == extract_number(f"x = {a}.{frac}000")
    assert extract_number(f"#### {a:,}") == str(a)


@PROPERTY
@given(name=st.sampled_from(SYNTHETIC), seed=st.integers(0, 2**32 - 1))
def test_gold_always_scores_one(name, seed):
    task = get_task(name)
    for ex in sum(task.splits(seed=seed, n_train=2, n_test=2).values(), []):
        assert task.reward(task.target(ex), ex) == 1.0


@PROPERTY
@given(a=st.integers(-(10**12), 10**12), cents=st.integers(0, 99), style=st.integers(0, 3))
def test_gsm8k_gold_number_always_scores_one(a, cents, style):
    gold = f"{a}.{cents:02d}" if cents else str(a)
    ex = {"question": "q", "answer": extract_number(gold), "solution": f"#### {gold}"}
    with_commas = f"{a:,}" + (f".{cents:02d}" if cents else "")
    text = [f"#### {gold}", f"A: {gold}.", f"so the answer is {with_commas}", f"${gold}"][style]
    assert get_task("gsm8k").reward(text, ex) == 1.0


def test_task_files_register_their_tasks_here_and_in_every_process_started_later(tmp_path,
                                                                                 monkeypatch):
    """A file named in `task_files` is imported once (its @register_task runs), and a process
    started afterwards (a workflow job) knows its task too; a missing file is named."""
    import subprocess
    import sys

    from logra.rl.tasks import TASK_FILES_ENV, TASKS, load_task_files
    monkeypatch.delenv(TASK_FILES_ENV, raising=False)  # restored when the test ends
    (tmp_path / "mine.py").write_text(
        "from logra.rl.tasks import SyntheticTask, register_task\n\n\n@register_task\n"
        "class Echo(SyntheticTask):\n    name = 'echo_file_test'\n\n"
        "    def generate(self, rng):\n        n = rng.randint(0, 99)\n"
        "        return {'question': str(n), 'answer': str(n)}\n")
    load_task_files([tmp_path / "mine.py"])
    load_task_files([tmp_path / "mine.py"])  # once only: no second registration
    assert TASKS["echo_file_test"]().splits(0, 3, 2)["train"][0]["prompt"].startswith("Q: ")
    child = subprocess.run([sys.executable, "-c", "from logra.rl.tasks import TASKS; "
                            "print('echo_file_test' in TASKS)"], capture_output=True, text=True)
    assert child.stdout.strip() == "True", child.stderr
    with pytest.raises(FileNotFoundError, match="task_files: .*missing.py is not a file"):
        load_task_files([tmp_path / "missing.py"])
