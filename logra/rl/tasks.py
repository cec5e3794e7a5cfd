"""Reasoning tasks with verifiable rewards.

Every task is a small :class:`Task` object found by name through a registry
(:func:`get_task`, :func:`register_task`). A task of one's own lives in a Python file named
in the config's ``task_files`` (:func:`load_task_files`): it is imported before the config is
checked, and in every process the workflow starts, through the ``LOGRA_TASK_FILES``
environment variable that this module reads when it is imported. A task turns a seed into train/test
lists of examples, formats prompts, gives the supervised completion for
warm-start SFT, and scores a model completion with a 0/1 reward; a task may report further
scores of a completion beside it in evaluation (`Task.extra_scores`, `Task.scores`).

Examples are plain dicts (so they round-trip through JSONL) with at least
``question``, ``answer`` (the final answer as a string) and ``prompt``, plus
task-specific fields. Prompts are ``"Q: <question>\\nA: "``; the completion is
whatever the model generates after the prompt. All prompt and target text is
printable ASCII plus newlines, because a tiny character-level model reads it.

Rewards never raise on arbitrary text:

* numeric tasks compare :func:`extract_number` of the completion with the gold
  answer. Synthetic tasks read only the completion's first non-blank line (a
  model may ramble on after answering); GSM8K reads the whole completion.
* countdown parses the first non-blank line (anything from the first ``=`` on
  is ignored) with a tiny recursive-descent parser over integers, ``+ - * /``
  and parentheses, evaluated exactly with :class:`fractions.Fraction`.
* MATH is graded by math-verify (`logra.rl.grading`: in a worker process, bounded in time),
  with a canonical-string tier beside it (`MathTask`); GSM8K keeps exact match on the final
  number as its reward. Evaluation reports math-verify's score alone beside both rewards.
  Only a gold answer math-verify cannot read raises (`GoldError`).

Synthetic splits are generated with ``random.Random(seed)``: the test split is
drawn first, so it depends only on ``(seed, n_test)``, and train questions are
drawn until ``n_train`` questions unseen in either split are found, so the
splits never share a question. An optional validation split (``n_val``, for
choosing hyperparameters) is drawn last the same way, so it changes neither
train nor test.
"""

from __future__ import annotations

import json
import os
import random
import re
import unicodedata
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Iterator

from logra.files import atomic_path, import_file
from logra.rl.grading import GoldError, check_gold, math_verify_score

Example = dict[str, Any]

# ---------------------------------------------------------------------------
# Numeric answer extraction
# ---------------------------------------------------------------------------

# A number: optional sign (not a binary minus as in "7-3"), optional "$",
# digits with optional thousands commas, optional decimal part. ASCII digits
# only, so unicode digits in model output are ignored.
_NUMBER = r"(?:(?<![0-9A-Za-z_)])-)?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
_NUMBER_RE = re.compile(_NUMBER)
_FINAL_RE = re.compile(r"####\s*(" + _NUMBER + ")")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:)[\s:]*(" + _NUMBER + ")", re.IGNORECASE)


def _canonical(number: str) -> str:
    """Exact canonical decimal form of a matched number: "$1,234.50" -> "1234.5".

    Pure string manipulation (no floats, no digit limits), so two numbers are
    numerically equal exactly when their canonical strings are equal.
    """
    text = number.replace("$", "").replace(",", "")
    negative = text.startswith("-")
    whole, _, frac = text.lstrip("-").partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    sign = "-" if negative and (whole != "0" or frac) else ""
    return sign + whole + ("." + frac if frac else "")


def extract_number(text: str) -> str | None:
    """Return the final numeric answer in ``text`` in canonical form, or None.

    Preference order: the number after the first ``####`` (GSM8K style), then
    the number right after the last "answer is" / "answer:", otherwise the
    last number in the text. "$", thousands commas, a trailing period and
    trailing decimal zeros are dropped, so "18.0" -> "18" and "1,234.50" ->
    "1234.5"; equal canonical strings mean exactly equal numbers.
    """
    final = _FINAL_RE.search(text)
    if final:
        return _canonical(final.group(1))
    answers = _ANSWER_IS_RE.findall(text)
    if answers:
        return _canonical(answers[-1])
    numbers = _NUMBER_RE.findall(text)
    return _canonical(numbers[-1]) if numbers else None


def _first_line(text: str) -> str:
    """The first non-blank line of ``text``, without surrounding whitespace."""
    return text.lstrip().partition("\n")[0].strip()


def _numeric_reward(text: str, gold: str) -> float:
    """1.0 if the number extracted from ``text`` equals the gold number."""
    got = extract_number(text)
    return float(got is not None and got == extract_number(gold))


# ---------------------------------------------------------------------------
# Safe arithmetic expressions (countdown)
# ---------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 64
_EXPRESSION_CHARS_RE = re.compile(r"[0-9+\-*/() ]*")


class _ParseError(Exception):
    pass


class _ExpressionParser:
    """Recursive descent over tokens: expr := term (('+'|'-') term)*,
    term := factor (('*'|'/') factor)*, factor := integer | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str | None:
        token = self._peek()
        self.pos += 1
        return token

    def expr(self) -> Fraction:
        value = self.term()
        while self._peek() in ("+", "-"):
            op, rhs = self._take(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self._peek() in ("*", "/"):
            op, rhs = self._take(), self.factor()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise _ParseError("division by zero")
            else:
                value /= rhs
        return value

    def factor(self) -> Fraction:
        token = self._take()
        if token == "(":
            value = self.expr()
            if self._take() != ")":
                raise _ParseError("missing ')'")
            return value
        if token is not None and token[0] in "0123456789":
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise _ParseError(f"unexpected token {token!r}")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]] | None:
    """Safely evaluate an integer expression with ``+ - * /`` and parentheses.

    Returns ``(exact value, integers used in order of appearance)``, or None
    if ``text`` is longer than MAX_EXPRESSION_CHARS, contains anything else
    (no unary minus, no names, no calls), is malformed, or divides by zero.
    """
    if len(text) > MAX_EXPRESSION_CHARS or not _EXPRESSION_CHARS_RE.fullmatch(text):
        return None
    parser = _ExpressionParser(re.findall(r"[0-9]+|\S", text))
    try:
        value = parser.expr()
    except _ParseError:
        return None
    if parser.pos != len(parser.tokens):
        return None
    return value, parser.numbers


# ---------------------------------------------------------------------------
# Task base classes and registry
# ---------------------------------------------------------------------------


class Task:
    """A reasoning task: data splits, prompt/target formatting and a reward."""

    name: str = ""
    eval_until: tuple[str, ...] = ("\n",)  # lm-eval stops generating at these (and at eos)

    def splits(self, seed: int, n_train: int | None, n_test: int | None,
               n_val: int = 0) -> dict[str, list[Example]]:
        """Return ``{"train": [...], "test": [...], "val": [...]}`` lists of examples; "val"
        is empty unless ``n_val`` is given. Synthetic splits share no question; dataset splits
        are disjoint by row."""
        raise NotImplementedError

    def prompt(self, example: Example) -> str:
        """The prompt the model completes: ``"Q: <question>\\nA: "``."""
        return f"Q: {example['question']}\nA: "

    def target(self, example: Example) -> str:
        """The supervised completion for warm-start SFT (the gold answer)."""
        return example["answer"]

    def reward(self, completion: str, example: Example) -> float:
        """1.0 if the first line of ``completion`` holds the gold number, else 0.0."""
        return _numeric_reward(_first_line(completion), example["answer"])

    # further scores of a completion that evaluation reports beside the reward, by name (lm-eval
    # metrics acc_<name> and pass_<name>, logra/harness/evaluate.py); `scores` computes them
    extra_scores: tuple[str, ...] = ()

    def scores(self, completion: str, example: Example) -> dict[str, float]:
        """This task's `extra_scores` of ``completion``, by name."""
        return {}


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator adding a Task subclass to TASKS under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name` to be registered")
    if cls.name in TASKS and TASKS[cls.name] is not cls:
        held = TASKS[cls.name]
        raise ValueError(f"a task named {cls.name!r} is already registered "
                         f"({held.__module__}.{held.__qualname__}); {cls.__qualname__} needs "
                         "a name of its own")
    TASKS[cls.name] = cls
    return cls


def get_task(name: str, **options: Any) -> Task:
    """Build the task registered as ``name`` with keyword ``options``.

    Unknown names raise ValueError listing the known ones; unknown options
    raise TypeError naming the option; bad option values raise ValueError.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)


# Generators give up after this many fruitless random draws in a row (the
# question space is too small for the split sizes, or the options are unusable).
_MAX_TRIES = 10_000


def _check_size(label: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{label} must be a non-negative int, got {n!r}")
    return n


class SyntheticTask(Task):
    """A task whose examples are generated from a seeded random.Random."""

    def generate(self, rng: random.Random) -> Example:
        """Draw one example (without ``prompt``) using only ``rng``."""
        raise NotImplementedError

    def splits(self, seed: int, n_train: int, n_test: int,
               n_val: int = 0) -> dict[str, list[Example]]:
        """Deterministic, question-disjoint splits drawn in the order test, train, val: test
        depends only on (seed, n_test), train not on n_val."""
        sizes = {"test": _check_size("n_test", n_test), "train": _check_size("n_train", n_train),
                 "val": _check_size("n_val", n_val)}
        rng = random.Random(seed)
        seen: set[str] = set()
        out: dict[str, list[Example]] = {split: [] for split in sizes}
        for split, size in sizes.items():
            duplicates = 0
            while len(out[split]) < size:
                example = self.generate(rng)
                if example["question"] in seen:
                    duplicates += 1
                    if duplicates > _MAX_TRIES:
                        raise ValueError(
                            f"{self.name}: only {len(seen)} distinct questions found; "
                            "lower n_train/n_test/n_val or widen the task options"
                        )
                    continue
                duplicates = 0
                seen.add(example["question"])
                example["prompt"] = self.prompt(example)
                out[split].append(example)
        return {"train": out["train"], "test": out["test"], "val": out["val"]}


def _check_ops(ops: str, allowed: str) -> str:
    if not ops or any(op not in allowed for op in ops):
        raise ValueError(f"ops must be a non-empty string of characters from {allowed!r}, got {ops!r}")
    return ops


# ---------------------------------------------------------------------------
# Synthetic tasks
# ---------------------------------------------------------------------------


@register_task
class ArithmeticTask(SyntheticTask):
    """``a<op>b`` on ``digits``-digit operands, e.g. "12+34" -> "46".

    For "-" the operands are ordered so the result is never negative.
    """

    name = "arithmetic"

    def __init__(self, *, digits: int = 2, ops: str = "+"):
        if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
            raise ValueError(f"digits must be a positive int, got {digits!r}")
        self.digits = digits
        self.ops = _check_ops(ops, "+-*")

    def generate(self, rng: random.Random) -> Example:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice(self.ops)
        if op == "-" and a < b:
            a, b = b, a
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"question": f"{a}{op}{b}", "answer": str(result)}


@register_task
class CountdownTask(SyntheticTask):
    """Reach a target with given numbers, e.g. "3 5 7 -> 22" -> "3*5+7".

    ``n_numbers`` numbers are drawn from 1..``max_number``; the target is the
    value of a random left-to-right expression over all of them (usual
    precedence) with operators from ``ops``, resampled until it is a positive
    integer, so a solution always exists (stored as ``answer``). A completion
    may use each given number AT MOST ONCE (not every number must be used),
    any of + - * / and parentheses, and must equal the target exactly.
    """

    name = "countdown"

    def __init__(self, *, n_numbers: int = 3, max_number: int = 9, ops: str = "+-*"):
        for label, value in (("n_numbers", n_numbers), ("max_number", max_number)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        if n_numbers * (len(str(max_number)) + 1) > MAX_EXPRESSION_CHARS:
            raise ValueError(f"n_numbers={n_numbers} makes solutions longer than {MAX_EXPRESSION_CHARS} chars")
        self.n_numbers = n_numbers
        self.max_number = max_number
        self.ops = _check_ops(ops, "+-*/")

    def generate(self, rng: random.Random) -> Example:
        for _ in range(_MAX_TRIES):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            expression = str(numbers[0])
            for number in numbers[1:]:
                expression += rng.choice(self.ops) + str(number)
            value = evaluate_expression(expression)
            if value is not None and value[0].denominator == 1 and value[0] >= 1:
                target = int(value[0])
                question = " ".join(map(str, numbers)) + f" -> {target}"
                return {"question": question, "answer": expression, "numbers": numbers, "target": target}
        raise ValueError(f"countdown: ops={self.ops!r} and max_number={self.max_number} give no positive integer targets")

    def reward(self, completion: str, example: Example) -> float:
        """1.0 if the completion's first line (up to any "=") is an expression
        equal to the target using each given number at most once."""
        result = evaluate_expression(_first_line(completion).partition("=")[0].strip())
        if result is None:
            return 0.0
        value, used = result
        return float(value == example["target"] and not Counter(used) - Counter(example["numbers"]))


@register_task
class LinearTask(SyntheticTask):
    """Solve ``a*x+b=c`` for an integer x, e.g. "3x+5=20" -> "5".

    a, b and x are drawn uniformly from the inclusive ranges ``a_range``
    (a = 0 is skipped), ``b_range`` and ``x_range``.
    """

    name = "linear"

    def __init__(
        self,
        *,
        a_range: tuple[int, int] = (1, 9),
        b_range: tuple[int, int] = (-20, 20),
        x_range: tuple[int, int] = (0, 20),
    ):
        for label, (low, high) in (("a_range", a_range), ("b_range", b_range), ("x_range", x_range)):
            if not (isinstance(low, int) and isinstance(high, int) and low <= high):
                raise ValueError(f"{label} must be (low, high) ints with low <= high, got {(low, high)!r}")
        if tuple(a_range) == (0, 0):
            raise ValueError("a_range must allow a non-zero coefficient")
        self.a_range, self.b_range, self.x_range = tuple(a_range), tuple(b_range), tuple(x_range)

    def generate(self, rng: random.Random) -> Example:
        a = 0
        while a == 0:
            a = rng.randint(*self.a_range)
        b, x = rng.randint(*self.b_range), rng.randint(*self.x_range)
        lhs = {1: "x", -1: "-x"}.get(a, f"{a}x")
        if b:
            lhs += f"{b:+d}"
        return {"question": f"{lhs}={a * x + b}", "answer": str(x)}


# ---------------------------------------------------------------------------
# GSM8K
# ---------------------------------------------------------------------------

_ASCII_REPLACEMENTS = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
        "\u2013": "-", "\u2014": "-", "\u2212": "-", "\u00d7": "*", "\u00f7": "/",
        "\u2044": "/", "\u00a0": " ", "\t": " ", "\u2028": "\n", "\u200b": "",
        "\u20ac": "EUR", "\u00a3": "GBP", "\u00a2": "c", "\u221a": "sqrt",
    }
)
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


def to_ascii(text: str) -> str:
    """Printable-ASCII (plus newline) version of ``text``: typographic
    punctuation mapped, accents stripped (NFKD), anything else dropped."""
    text = unicodedata.normalize("NFKD", text).translate(_ASCII_REPLACEMENTS)
    return "".join(ch for ch in text if ch == "\n" or " " <= ch <= "~")


class HubTask(Task):
    """A task read from a dataset: each split from a local JSONL file (``train_path`` /
    ``test_path``) or, when no path is given, from ``datasets.load_dataset(hub, config)``.
    Rows keep their order; the seed is unused and n_train/n_test keep the first rows (None =
    all); a validation split is the n_val train rows after the first n_train. Subclasses turn
    one raw row into an example (``parse``), naming the row on error.
    Completions are multi-line: evaluation stops at eos only."""

    hub, config = "", None
    eval_until: tuple[str, ...] = ()

    def __init__(self, *, train_path: str | os.PathLike | None = None,
                 test_path: str | os.PathLike | None = None, hub: str | None = None,
                 config: str | None = None):
        self.paths = {"train": train_path, "test": test_path}
        self.hub, self.config = hub or self.hub, config or self.config

    def _rows(self, split: str) -> tuple[str, Iterable[tuple[str, dict]]]:
        """(source label, iterable of (location, raw row)) for one split."""
        path = self.paths[split]
        if path is not None:
            return str(path), ((f"{path}:{lineno}", row) for lineno, row in _iter_jsonl(path))
        from datasets import load_dataset  # only needed without local files

        source = f"{self.hub}/{self.config}[{split}]"
        rows = load_dataset(self.hub, self.config, split=split)
        return source, ((f"{source} row {i}", dict(row)) for i, row in enumerate(rows, 1))

    def parse(self, row: dict, where: str) -> Example:
        raise NotImplementedError

    def load_split(self, split: str, limit: int | None = None) -> list[Example]:
        """Read and validate one split ("train" or "test"), keeping ``limit`` rows."""
        source, rows = self._rows(split)
        examples = []
        for where, row in rows:
            example = self.parse(row, where)
            example["prompt"] = self.prompt(example)
            examples.append(example)
        if not examples:
            raise ValueError(f"{source}: empty {split} split")
        return examples if limit is None else examples[: _check_size(f"n_{split}", limit)]

    def splits(self, seed: int, n_train: int | None, n_test: int | None,
               n_val: int = 0) -> dict[str, list[Example]]:
        """The first n_train / n_test rows of each split (None = all) and, as "val", the n_val
        train rows that follow the first n_train; seed unused."""
        if _check_size("n_val", n_val) and n_train is None:
            raise ValueError(f"{self.name}: n_val={n_val} needs n_train (val is the train rows "
                             "after the first n_train)")
        train = self.load_split("train", None if n_train is None else n_train + n_val)
        if n_val and len(train) < n_train + n_val:
            raise ValueError(f"{self.name}: n_train={n_train} + n_val={n_val} exceeds the "
                             f"{len(train)} train rows")
        return {"train": train[:n_train], "test": self.load_split("test", n_test),
                "val": train[n_train:] if n_val else []}


def _require(row: dict, where: str, *fields: str) -> None:
    for field in fields:
        if not isinstance(row.get(field), str):
            raise ValueError(f"{where}: missing or non-string field {field!r}")


class MathVerifyScore:
    """A task whose evaluation reports math-verify's score of a completion beside its reward
    (`logra.rl.grading.math_verify_score` against the example's answer)."""
    extra_scores = ("math_verify",)

    def scores(self, completion: str, example: Example) -> dict[str, float]:
        return {"math_verify": math_verify_score(example["answer"], completion)}


@register_task
class GSM8KTask(MathVerifyScore, HubTask):
    """Grade-school math word problems (GSM8K), rows ``{"question": ..., "answer": "...reasoning...
    #### 72"}``. ``answer`` is the canonical final number, ``solution`` the original answer text
    and ``question`` is converted to ASCII. The SFT target is the ASCII solution without
    ``<<...>>`` calculator annotations, still ending in ``#### N``. The reward reads the whole
    completion: exact match on the final number, the field's convention for GSM8K; evaluation
    reports math-verify's score beside it (``math_verify``: `logra.rl.grading`).
    """

    name = "gsm8k"
    hub, config = "openai/gsm8k", "main"

    def parse(self, row: dict, where: str) -> Example:
        _require(row, where, "question", "answer")
        final = _FINAL_RE.search(row["answer"])
        if final is None:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>' final answer")
        return {"question": to_ascii(row["question"]).strip(),
                "answer": _canonical(final.group(1)), "solution": row["answer"]}

    def target(self, example: Example) -> str:
        """ASCII reasoning without calculator annotations, ending in "#### N"."""
        return _CALCULATOR_RE.sub("", to_ascii(example["solution"])).strip()

    def reward(self, completion: str, example: Example) -> float:
        """1.0 if extract_number(completion) equals the gold number."""
        return _numeric_reward(completion, example["answer"])


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces
    balanced, or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


_LATEX_NOISE = [r"\\left", r"\\right", r"\\!", r"\\,", r"\\;", r"\\ ", r"\\?\$",
                r"\^\{?\\circ\}?", r"\\?%", r"\{,\}"]


def normalize_math(answer: str) -> str:
    """A MATH answer in a canonical string form: spacing, ``\\left``/``\\right``, ``$``,
    degrees, percent, units (``\\text{ cm}``) and ``\\text{...}`` wrappers dropped,
    ``\\dfrac``/``\\tfrac`` as ``\\frac``, ``\\frac12`` as ``\\frac{1}{2}``, ``\\sqrt2``
    as ``\\sqrt{2}``, a trailing period removed, and plain numbers in canonical decimal form
    ("0.50" -> "0.5", "1{,}000" -> "1000")."""
    text = answer.strip()
    text = re.sub(r"\\(?:text|mbox)\{\s.*?\}", "", text)  # units: "5\text{ cm}"
    text = re.sub(r"\\(?:text|mbox|mathrm|textbf)\{(.*?)\}", r"\1", text)
    for noise in _LATEX_NOISE:
        text = re.sub(noise, "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = re.sub(r"\s+", "", text).rstrip(".")
    if re.fullmatch(_NUMBER, text):
        text = _canonical(text)
    return text


@register_task
class MathTask(MathVerifyScore, HubTask):
    """Competition mathematics (MATH, Hendrycks et al. 2021), rows ``{"problem": ...,
    "solution": "... \\boxed{answer} ..."}``. ``answer`` is the last boxed expression of the
    solution; a row whose answer math-verify cannot read is refused, naming the row. The
    reward is 1.0 when math-verify (`logra.rl.grading.math_verify_score`) finds the answer it
    extracts from the completion (the one after "final answer is", else the boxed ones, else
    the last expression: a box is asked for, not required) equivalent to the gold one, or when
    the completion's last boxed expression equals it after `normalize_math`. Deviation from
    math-verify alone, stated: that string tier (the authors' grader has one too) scores
    right answers math-verify cannot read, such as a period inside the box (``\\boxed{10.}``)
    or a thin space between thousands (``1\\,000``), and a last box after others
    (``\\boxed{2}, no: \\boxed{3}``, which math-verify reads as the set {2, 3}); it can only
    add 1s where the strings agree (tests/rl/test_math_grading.py). Evaluation reports
    math-verify's score alone beside the reward (``math_verify``), as the field grades MATH."""

    name = "math"
    hub, config = "DigitalLearningGmbH/MATH-lighteval", "default"

    def parse(self, row: dict, where: str) -> Example:
        _require(row, where, "problem", "solution")
        answer = last_boxed(row["solution"])
        if answer is None:
            raise ValueError(f"{where}: field 'solution' has no \\boxed{{...}} answer")
        try:
            check_gold(answer)
        except GoldError as e:
            raise ValueError(f"{where}: field 'solution': {e}") from None
        return {"question": to_ascii(row["problem"]).strip(), "answer": answer,
                "solution": row["solution"]}

    def prompt(self, example: Example) -> str:
        return (f"Q: {example['question']}\nPut the final answer in \\boxed{{}}.\nA: ")

    def target(self, example: Example) -> str:
        return to_ascii(example["solution"]).strip()

    def reward(self, completion: str, example: Example) -> float:
        # math-verify first: it raises on a gold it cannot read, which the strings could match
        if math_verify_score(example["answer"], completion):
            return 1.0
        got = last_boxed(completion)
        return float(got is not None and normalize_math(got) == normalize_math(example["answer"]))


# ---------------------------------------------------------------------------
# JSONL IO
# ---------------------------------------------------------------------------


def _iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, object) for each non-blank line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[error.start]:02x} at "
                                 f"column {error.start + 1}); JSONL files are UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | os.PathLike, required: Iterable[str] = ()) -> list[dict]:
    """Read a JSONL file of objects (blank lines skipped).

    Raises ValueError naming the file and 1-based line number for a malformed
    line, a non-object or a row without one of the ``required`` fields, and
    naming the file when it holds no rows.
    """
    rows = []
    for lineno, row in _iter_jsonl(path):
        missing = [f for f in required if f not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing field {missing[0]!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: empty JSONL file (no rows)")
    return rows


def check_lengths(task: Task, splits: dict[str, list[Example]], max_chars: int,
                  files: dict[str, str]) -> None:
    """Refuse an example whose prompt + target exceeds `max_chars` (config
    `data.max_example_chars`), naming the file its split is written to (`files`) and its line
    there, and the task's own source file where it reads one."""
    for split, examples in splits.items():
        for line, example in enumerate(examples, 1):
            n = len(example["prompt"]) + len(task.target(example))
            if n > max_chars:
                source = getattr(task, "paths", {}).get("test" if split == "test" else "train")
                raise ValueError(
                    f"{files.get(split, split)}:{line}: a {split} example of {n:,} characters "
                    f"(prompt + target) exceeds data.max_example_chars = {max_chars:,}"
                    + (f" (read from {source})" if source else "")
                    + "; shorten or drop it, or raise the cap")


def check_overlap(splits: dict[str, list[Example]], files: dict[str, str],
                  allow: bool = False) -> list[str]:
    """Refuse held-out examples (test, val) whose prompt repeats one of an earlier split (in the
    order train, test, val) or of their own: a score on them measures recall of a trained (or
    already counted) question. The message counts them per split and names the first line of
    each in the files the splits are written to (`files`). With `allow` (config
    `data.allow_overlap`) the same lines are returned instead, for the job's log."""
    seen: dict[str, tuple[str, int]] = {}
    found = []
    for split in ("train", "test", "val"):
        repeats = []
        for line, example in enumerate(splits.get(split, []), 1):
            if split != "train" and example["prompt"] in seen:
                repeats.append((line, seen[example["prompt"]]))
            seen.setdefault(example["prompt"], (split, line))
        if repeats:
            line, (first, first_line) = repeats[0]
            counts = Counter(s for _, (s, _) in repeats)
            found.append(f"{files.get(split, split)}: {len(repeats)} of {len(splits[split])} "
                         f"{split} questions repeat earlier ones ("
                         + ", ".join(f"{n} from {s}" for s, n in counts.items())
                         + f"; first: line {line}, as {files.get(first, first)}:{first_line})")
    if found and not allow:
        raise ValueError("; ".join(found) + ": remove them from the task's files, or set "
                         "data.allow_overlap: true to keep them knowingly")
    return found


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Atomically write ``rows`` as JSONL (see logra/files.py)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------
# Tasks of one's own: config `task_files`
# ---------------------------------------------------------------------------

TASK_FILES_ENV = "LOGRA_TASK_FILES"


def load_task_files(paths: Iterable[str | os.PathLike]) -> None:
    """Import each Python file of ``paths`` (config ``task_files``, relative to the working
    directory) once, so the tasks it registers are known, and put the files into
    ``LOGRA_TASK_FILES``: every process started from here on (each workflow job, lm-eval's
    scorer, torchrun's ranks) imports them when it imports this module. A file that is missing,
    or whose import raises anything (SystemExit included), raises ValueError naming it."""
    files = [Path(p).resolve() for p in paths]
    for path in files:
        import_file(path, "task_files")
    known = [p for p in os.environ.get(TASK_FILES_ENV, "").split(os.pathsep) if p]
    os.environ[TASK_FILES_ENV] = os.pathsep.join(dict.fromkeys(known + list(map(str, files))))


load_task_files(p for p in os.environ.get(TASK_FILES_ENV, "").split(os.pathsep) if p)
