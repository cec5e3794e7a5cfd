"""The task API and its registry: a `Task` turns a seed into example splits, formats prompts
and SFT targets and scores a completion; `register_task` names it, `get_task` builds it;
`load_task_files` imports the config's own task files in every process (`LOGRA_TASK_FILES`).
Beside them the checks of a task's splits before they are written (`check_lengths`,
`check_overlap`)."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from logra.files import import_file
from logra.rl.tasks.answers import first_line, numeric_reward


Example = dict[str, Any]


class Task:
    """A reasoning task: data splits, prompt/target formatting and a reward."""

    name: str = ""
    eval_until: tuple[str, ...] = ("\n",)  # lm-eval stops generating at these (and at eos)

    def splits(self, seed: int, n_train: int | None, n_test: int | None,
               n_val: int = 0) -> dict[str, list[Example]]:
        """Return `{"train": [...], "test": [...], "val": [...]}` lists of examples; "val"
        is empty unless `n_val` is given. Synthetic splits share no question; dataset splits
        are disjoint by row."""
        raise NotImplementedError

    def prompt(self, example: Example) -> str:
        """The prompt the model completes: `"Q: <question>\\nA: "`."""
        return f"Q: {example['question']}\nA: "

    def target(self, example: Example) -> str:
        """The supervised completion for warm-start SFT (the gold answer)."""
        return example["answer"]

    def reward(self, completion: str, example: Example) -> float:
        """1.0 if the first line of `completion` holds the gold number, else 0.0."""
        return numeric_reward(first_line(completion), example["answer"])

    # further scores of a completion that evaluation reports beside the reward, by name (lm-eval
    # metrics acc_<name> and pass_<name>, logra/harness/evaluate.py); `scores` computes them
    extra_scores: tuple[str, ...] = ()

    def scores(self, completion: str, example: Example) -> dict[str, float]:
        """This task's `extra_scores` of `completion`, by name."""
        return {}


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator adding a Task subclass to TASKS under `cls.name`."""
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
    """Build the task registered as `name` with keyword `options`.

    Unknown names raise ValueError listing the known ones; unknown options
    raise TypeError naming the option; bad option values raise ValueError.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name](**options)


def check_size(label: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{label} must be a non-negative int, got {n!r}")
    return n


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


TASK_FILES_ENV = "LOGRA_TASK_FILES"


def load_task_files(paths: Iterable[str | os.PathLike]) -> None:
    """Import each Python file of `paths` (config `task_files`, relative to the working
    directory) once, so the tasks it registers are known, and put the files into
    `LOGRA_TASK_FILES`: every process started from here on (each workflow job, lm-eval's
    scorer, torchrun's ranks) imports them when it imports this module. A file that is missing,
    or whose import raises anything (SystemExit included), raises ValueError naming it."""
    files = [Path(p).resolve() for p in paths]
    for path in files:
        import_file(path, "task_files")
    known = [p for p in os.environ.get(TASK_FILES_ENV, "").split(os.pathsep) if p]
    os.environ[TASK_FILES_ENV] = os.pathsep.join(dict.fromkeys(known + list(map(str, files))))
