"""Tasks read from a dataset (`HubTask`): each split from a local JSONL file or from the hub,
rows in order. GSM8K keeps exact match on the final number as its reward; MATH is graded by
math-verify (`logra.rl.grading`, in a worker process, bounded in time) with a canonical-string
tier beside it; evaluation reports math-verify's score of both beside their rewards."""
from __future__ import annotations

import os
from typing import Iterable

from logra.files import iter_jsonl
from logra.rl.grading import GoldError, check_gold, math_verify_score
from logra.rl.tasks.answers import (CALCULATOR_RE, FINAL_RE, canonical, last_boxed,
                                    normalize_math, numeric_reward, to_ascii)
from logra.rl.tasks.base import Example, Task, check_size, register_task


class HubTask(Task):
    """A task read from a dataset: each split from a local JSONL file (`train_path` /
    `test_path`) or, when no path is given, from `datasets.load_dataset(hub, config)`.
    Rows keep their order; the seed is unused and n_train/n_test keep the first rows (None =
    all); a validation split is the n_val train rows after the first n_train. Subclasses turn
    one raw row into an example (`parse`), naming the row on error.
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
            return str(path), ((f"{path}:{lineno}", row) for lineno, row in iter_jsonl(path))
        from datasets import load_dataset  # only needed without local files

        source = f"{self.hub}/{self.config}[{split}]"
        rows = load_dataset(self.hub, self.config, split=split)
        return source, ((f"{source} row {i}", dict(row)) for i, row in enumerate(rows, 1))

    def parse(self, row: dict, where: str) -> Example:
        raise NotImplementedError

    def load_split(self, split: str, limit: int | None = None) -> list[Example]:
        """Read and validate one split ("train" or "test"), keeping `limit` rows."""
        source, rows = self._rows(split)
        examples = []
        for where, row in rows:
            example = self.parse(row, where)
            example["prompt"] = self.prompt(example)
            examples.append(example)
        if not examples:
            raise ValueError(f"{source}: empty {split} split")
        return examples if limit is None else examples[: check_size(f"n_{split}", limit)]

    def splits(self, seed: int, n_train: int | None, n_test: int | None,
               n_val: int = 0) -> dict[str, list[Example]]:
        """The first n_train / n_test rows of each split (None = all) and, as "val", the n_val
        train rows that follow the first n_train; seed unused."""
        if check_size("n_val", n_val) and n_train is None:
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
    """Grade-school math word problems (GSM8K), rows `{"question": ..., "answer": "...reasoning...
    #### 72"}`. `answer` is the canonical final number, `solution` the original answer text
    and `question` is converted to ASCII. The SFT target is the ASCII solution without
    `<<...>>` calculator annotations, still ending in `#### N`. The reward reads the whole
    completion: exact match on the final number, the field's convention for GSM8K; evaluation
    reports math-verify's score beside it (`math_verify`: `logra.rl.grading`).
    """

    name = "gsm8k"
    hub, config = "openai/gsm8k", "main"

    def parse(self, row: dict, where: str) -> Example:
        _require(row, where, "question", "answer")
        final = FINAL_RE.search(row["answer"])
        if final is None:
            raise ValueError(f"{where}: field 'answer' has no '#### <number>' final answer")
        return {"question": to_ascii(row["question"]).strip(),
                "answer": canonical(final.group(1)), "solution": row["answer"]}

    def target(self, example: Example) -> str:
        """ASCII reasoning without calculator annotations, ending in "#### N"."""
        return CALCULATOR_RE.sub("", to_ascii(example["solution"])).strip()

    def reward(self, completion: str, example: Example) -> float:
        """1.0 if extract_number(completion) equals the gold number."""
        return numeric_reward(completion, example["answer"])


@register_task
class MathTask(MathVerifyScore, HubTask):
    """Competition mathematics (MATH, Hendrycks et al. 2021), rows `{"problem": ...,
    "solution": "... \\boxed{answer} ..."}`. `answer` is the last boxed expression of the
    solution; a row whose answer math-verify cannot read is refused, naming the row. The
    reward is 1.0 when math-verify (`logra.rl.grading.math_verify_score`) finds the answer it
    extracts from the completion (the one after "final answer is", else the boxed ones, else
    the last expression: a box is asked for, not required) equivalent to the gold one, or when
    the completion's last boxed expression equals it after `normalize_math`. Deviation from
    math-verify alone, stated: that string tier (the authors' grader has one too) scores
    right answers math-verify cannot read, such as a period inside the box (`\\boxed{10.}`)
    or a thin space between thousands (`1\\,000`), and a last box after others
    (`\\boxed{2}, no: \\boxed{3}`, which math-verify reads as the set {2, 3}); it can only
    add 1s where the strings agree (tests/rl/test_math_grading.py). Evaluation reports
    math-verify's score alone beside the reward (`math_verify`), as the field grades MATH."""

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
