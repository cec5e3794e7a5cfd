"""Reasoning tasks with verifiable rewards, found by name (`get_task`, `register_task`).

Examples are plain dicts (they round-trip through JSONL) with at least `question`, `answer`
(the final answer as a string) and `prompt`, `"Q: <question>\nA: "`, plus a task's own fields;
the completion is whatever the model generates after the prompt. Prompt and target text is
printable ASCII plus newlines (a tiny character-level model reads it). A reward is 0/1 and
never raises on arbitrary text; a task may report further scores beside it in evaluation
(`Task.extra_scores`). The API and registry: `base`; answer parsing: `answers`; generated
tasks: `synthetic`; dataset tasks (GSM8K, MATH): `datasets`. A task of one's own lives in a
file named by the config's `task_files` (`load_task_files`), imported here in every process.
"""
import os

from logra.files import read_jsonl, write_jsonl  # noqa: F401  (re-exported)
from logra.rl.tasks.answers import (  # noqa: F401
    evaluate_expression, extract_number, last_boxed, normalize_math, to_ascii)
from logra.rl.tasks.base import (  # noqa: F401
    TASK_FILES_ENV, TASKS, Example, Task, check_lengths, check_overlap, get_task,
    load_task_files, register_task)
from logra.rl.tasks.datasets import GSM8KTask, HubTask, MathTask, MathVerifyScore  # noqa: F401
from logra.rl.tasks.synthetic import (  # noqa: F401
    ArithmeticTask, CountdownTask, LinearTask, SyntheticTask)

load_task_files(p for p in os.environ.get(TASK_FILES_ENV, "").split(os.pathsep) if p)
