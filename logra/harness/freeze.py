"""A frozen analysis plan stays frozen (results/analysis_plan.json, each study horizon's
results/study/<horizon>/analysis_plan.json).

Each plan records the config it was written from (its `spec`: what its rule's params hold).
When Snakemake is started and a test evaluation exists under a plan (of a task both the plan
and the config evaluate: a grid switched to other tasks is a new plan), `guard` compares that
spec with the config's: any difference would make Snakemake write another plan and score the
test split again, so it is refused before any job runs, naming each changed key with its old
and new values. `--config amend_plan=true` replaces the plan on purpose: the old plan is kept
as `<plan>.amended-<n>.json`, the change is added to `<plan>.amendments.json`, and the new plan
lists every amendment (`amendments`), which the report states. A plan written before plans
recorded their spec is not checked.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from logra.harness.schema import ConfigError


class PlanFrozen(ConfigError):
    """A config change that would rewrite a plan under which test evaluations exist."""


def canonical(value):
    """`value` as JSON gives it back (tuples as lists, keys as strings): what a plan holds."""
    return json.loads(json.dumps(value, default=str))


def changes(old, new, key: str = "") -> dict[str, tuple]:
    """{dotted key: (old, new)} of every leaf where `old` and `new` differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = {}
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{key}.{k}" if key else str(k)
            out |= changes(old.get(k, "(absent)"), new.get(k, "(absent)"), sub)
        return out
    return {} if old == new else {key or "(the spec)": (old, new)}


def amendments_path(plan: Path) -> Path:
    return plan.with_name(plan.stem + ".amendments.json")


def amendments(plan: str | Path) -> list[dict]:
    """The amendments recorded beside `plan` (`guard`), oldest first."""
    path = amendments_path(Path(plan))
    return json.loads(path.read_text()) if path.exists() else []


def guard(plan: str | Path, spec: dict, test_dirs: list[str | Path], tasks_of,
          amend: bool, dry_run: bool = False) -> dict[str, tuple]:
    """Refuse (`PlanFrozen`) a `spec` other than the one `plan` was written from while a test
    evaluation exists under it (a JSON under `<test dir>/<task>/`, for a task `tasks_of` finds
    in both specs), unless `amend`: then archive the old plan and record the amendment (not in
    a dry run). Returns the changes ({} if none)."""
    plan = Path(plan)
    if not plan.exists():
        return {}
    try:
        frozen = json.loads(plan.read_text()).get("spec")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise PlanFrozen(f"{plan}: not a plan ({e}); restore it, or remove it with the test "
                         "evaluations made under it") from None
    if frozen is None:
        return {}
    spec = canonical(spec)
    shared = sorted(set(tasks_of(frozen)) & set(tasks_of(spec)))
    tests = sorted(p for d in test_dirs for t in shared for p in (Path(d) / t).rglob("*.json"))
    if not tests:
        return {}
    changed = changes(frozen, spec)
    if not changed:
        return {}
    listed = "; ".join(f"{k}: {json.dumps(old)} -> {json.dumps(new)}"
                       for k, (old, new) in changed.items())
    if not amend:
        raise PlanFrozen(
            f"{plan} is frozen: {len(tests)} test evaluations exist under it (e.g. {tests[0]}), "
            f"and this config would write another plan: {listed}. Restore those values, or "
            "amend the plan on purpose with `--config amend_plan=true` (the old plan is kept "
            "and the report states the amendment: docs/verdicts.md#a-frozen-plan)")
    if not dry_run:
        record = amendments(plan)
        archived = plan.with_name(f"{plan.stem}.amended-{len(record) + 1}.json")
        shutil.copy2(plan, archived)
        record.append({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "test_evaluations": len(tests), "archived": str(archived),
                       "changed": {k: list(v) for k, v in changed.items()}})
        amendments_path(plan).write_text(json.dumps(record, indent=1) + "\n")
    return changed
