"""Tasks generated from a seed (`SyntheticTask`): arithmetic, countdown, linear equations. Splits
are drawn with `random.Random(seed)`, test first (it depends only on (seed, n_test)), then
train until n_train questions unseen in either split are found, then validation: no split
shares a question, and n_val changes neither train nor test."""
from __future__ import annotations

import random
from collections import Counter

from logra.rl.tasks.answers import MAX_EXPRESSION_CHARS, evaluate_expression, first_line
from logra.rl.tasks.base import Example, Task, check_size, register_task


# Generators give up after this many fruitless random draws in a row (the
# question space is too small for the split sizes, or the options are unusable).
_MAX_TRIES = 10_000


class SyntheticTask(Task):
    """A task whose examples are generated from a seeded random.Random."""

    def generate(self, rng: random.Random) -> Example:
        """Draw one example (without `prompt`) using only `rng`."""
        raise NotImplementedError

    def splits(self, seed: int, n_train: int, n_test: int,
               n_val: int = 0) -> dict[str, list[Example]]:
        """Deterministic, question-disjoint splits drawn in the order test, train, val: test
        depends only on (seed, n_test), train not on n_val."""
        sizes = {"test": check_size("n_test", n_test), "train": check_size("n_train", n_train),
                 "val": check_size("n_val", n_val)}
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


@register_task
class ArithmeticTask(SyntheticTask):
    """`a<op>b` on `digits`-digit operands, e.g. "12+34" -> "46".

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

    `n_numbers` numbers are drawn from 1..`max_number`; the target is the
    value of a random left-to-right expression over all of them (usual
    precedence) with operators from `ops`, resampled until it is a positive
    integer, so a solution always exists (stored as `answer`). A completion
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
        result = evaluate_expression(first_line(completion).partition("=")[0].strip())
        if result is None:
            return 0.0
        value, used = result
        return float(value == example["target"] and not Counter(used) - Counter(example["numbers"]))


@register_task
class LinearTask(SyntheticTask):
    """Solve `a*x+b=c` for an integer x, e.g. "3x+5=20" -> "5".

    a, b and x are drawn uniformly from the inclusive ranges `a_range`
    (a = 0 is skipped), `b_range` and `x_range`.
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
