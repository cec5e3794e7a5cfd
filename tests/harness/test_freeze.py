"""A frozen analysis plan stays frozen (logra/harness/freeze.py)."""
import json

import pytest

from logra.analysis.markdown import amended_lines
from logra.harness.freeze import PlanFrozen, amendments, changes, guard

SPEC = {"tasks": ["a"], "verdict": {"margin": {"fraction": 0.5, "seeds": [2]}},
        "seeds": [0, 1],
        "method_config": {"logra": {"rule": "logra", "options": {"rank": 2}}}}


def frozen_plan(tmp_path, spec=SPEC):
    """A plan written from `spec`, with one test evaluation of task a; (plan, its test dirs)."""
    plan = tmp_path / "analysis_plan.json"
    plan.write_text(json.dumps({"frozen": "before any test evaluation", "spec": spec}))
    (tmp_path / "eval/a/dense_adam").mkdir(parents=True)
    (tmp_path / "eval/a/dense_adam/seed0.json").write_text("{}")
    return plan, [tmp_path / "eval"]


def tasks(spec):
    return spec["tasks"]


def test_changes_name_every_changed_leaf_with_both_values():
    new = {"tasks": ["a"], "verdict": {"margin": {"fraction": 0.25, "seeds": [2]}},
           "seeds": [0, 1, 2],
           "method_config": {"logra": {"rule": "logra", "options": {"rank": 2}}}}
    assert changes(SPEC, new) == {"verdict.margin.fraction": (0.5, 0.25),
                                  "seeds": ([0, 1], [0, 1, 2])}
    assert changes(SPEC, {**SPEC, "n_test": 6}) == {"n_test": ("(absent)", 6)}
    assert changes(SPEC, json.loads(json.dumps(SPEC))) == {}


def test_a_plan_with_test_evaluations_refuses_another_spec_and_keeps_itself(tmp_path):
    plan, tests = frozen_plan(tmp_path)
    before = plan.read_text()
    new = {**SPEC, "verdict": {"margin": {"fraction": 0.25, "seeds": [2]}}}
    with pytest.raises(PlanFrozen, match=r"analysis_plan.json is frozen: 1 test evaluations "
                       r"exist under it .*verdict\.margin\.fraction: 0\.5 -> 0\.25\. .*"
                       r"--config amend_plan=true"):
        guard(plan, new, tests, tasks, amend=False)
    assert plan.read_text() == before and amendments(plan) == []
    assert guard(plan, SPEC, tests, tasks, amend=False) == {}  # the same spec: nothing to refuse
    assert guard(plan, new, [], tasks, amend=False) == {}  # no test evaluation: free to change


def test_amending_archives_the_plan_and_records_the_change_for_the_report(tmp_path):
    plan, tests = frozen_plan(tmp_path)
    before = plan.read_text()
    new = {**SPEC, "seeds": [0, 1, 2]}
    assert guard(plan, new, tests, tasks, amend=True, dry_run=True) == {
        "seeds": ([0, 1], [0, 1, 2])}
    assert amendments(plan) == []  # a dry run writes nothing
    guard(plan, new, tests, tasks, amend=True)
    (record,) = amendments(plan)
    assert record["changed"] == {"seeds": [[0, 1], [0, 1, 2]]}
    assert record["test_evaluations"] == 1
    assert (tmp_path / "analysis_plan.amended-1.json").read_text() == before
    assert record["archived"] == str(tmp_path / "analysis_plan.amended-1.json")
    (line,) = amended_lines({"amendments": [record]})
    assert line.startswith("- **Plan amended after test results existed**")
    assert "`seeds` [0, 1] → [0, 1, 2]" in line and "analysis_plan.amended-1.json" in line


def test_a_plan_without_a_spec_is_not_checked_and_a_corrupt_one_is_named(tmp_path):
    plan, tests = frozen_plan(tmp_path)
    plan.write_text(json.dumps({"frozen": "before any test evaluation"}))
    assert guard(plan, {"tasks": ["a"], "seeds": [9]}, tests, tasks, amend=False) == {}
    plan.write_text('{"frozen": "bef')
    with pytest.raises(PlanFrozen, match=r"analysis_plan.json: not a plan"):
        guard(plan, SPEC, tests, tasks, amend=False)


def test_a_grid_switched_to_other_tasks_is_a_new_plan(tmp_path):
    """Test evaluations of a task the new config does not evaluate leave its plan free."""
    plan, tests = frozen_plan(tmp_path)
    switched = {**SPEC, "tasks": ["b"], "seeds": [5]}
    assert guard(plan, switched, tests, tasks, amend=False) == {}
    with pytest.raises(PlanFrozen, match=r'tasks: \["a"\] -> \["a", "b"\]'):
        guard(plan, {**SPEC, "tasks": ["a", "b"]}, tests, tasks, amend=False)
