"""Aggregation tables built from run summaries and lm-eval JSONs as the workflow writes them."""
from pathlib import Path

import pytest

from logra.io import write_json
from logra.report import lr_sweep_table

SWEEP = {"adam_lr1": ("adam", 1e-4), "adam_lr2": ("adam", 1e-3), "adam_lr3": ("adam", 1e-2),
         "rule_lr1": ("rule", 1e-4), "rule_lr2": ("rule", 1e-3), "flaky_lr1": ("flaky", 1e-4)}
# (task, run name, seed) -> (status, final training reward, validation accuracy)
RUNS = {("a", "adam_lr1", 0): ("ok", 0.9, 0.30), ("a", "adam_lr1", 1): ("ok", 0.9, 0.32),
        ("a", "adam_lr2", 0): ("ok", 0.1, 0.40), ("a", "adam_lr2", 1): ("ok", 0.1, 0.42),
        # the best accuracy on its one ok seed, but a seed diverged: not eligible
        ("a", "adam_lr3", 0): ("ok", 0.5, 0.45), ("a", "adam_lr3", 1): ("diverged", 0.0, 0.99),
        ("a", "rule_lr1", 0): ("ok", 0.3, 0.35), ("a", "rule_lr2", 0): ("ok", 0.4, 0.35),  # a tie
        ("a", "flaky_lr1", 0): ("oom", None, 0.50),  # no lr of this method finished
        # another task: its own choice
        ("b", "adam_lr1", 0): ("ok", 0.2, 0.60), ("b", "adam_lr2", 0): ("ok", 0.2, 0.50)}


def _sweep_files(root: Path):
    runs, vals = [], []
    for (task, name, seed), (status, reward, acc) in RUNS.items():
        run = root / "runs" / task / name / f"seed{seed}"
        write_json(run / "summary.json", {"task": task, "method": name, "seed": seed,
                                          "status": status, "final_reward": reward})
        val = root / "val" / task / name / f"seed{seed}.json"
        write_json(val, {"accuracy": acc, "model_dir": str(run / "model")})
        runs.append(run / "summary.json")
        vals.append(val)
    return runs, vals


def test_lr_sweep_chooses_by_validation_accuracy_over_complete_lrs(tmp_path):
    runs, vals = _sweep_files(tmp_path)
    table = lr_sweep_table(runs, vals, SWEEP).set_index(["task", "method", "lr"])
    assert table.loc[("a", "adam", 1e-3), "val_accuracy_mean"] == pytest.approx(0.41)
    assert table.loc[("a", "adam", 1e-2), ["n_ok", "n_seeds"]].tolist() == [1, 2]
    assert table.loc[("a", "adam", 1e-2), "val_accuracy_mean"] == pytest.approx(0.45)  # ok seeds
    chosen = table[table["chosen"]].index.tolist()
    # not adam's best training reward (1e-4) nor its incomplete 1e-2; a tie: the smaller lr;
    # none for a method without a complete lr; each task its own
    assert chosen == [("a", "adam", 1e-3), ("a", "rule", 1e-4), ("b", "adam", 1e-4)]


def test_lr_sweep_refuses_evaluations_that_do_not_match_the_runs(tmp_path):
    runs, vals = _sweep_files(tmp_path)
    with pytest.raises(ValueError):  # one evaluation missing
        lr_sweep_table(runs, vals[:-1], SWEEP)
    with pytest.raises(ValueError, match="adam_lr1/seed1/model, not the model of .*adam_lr1/seed0"):
        lr_sweep_table(runs, [vals[1]] + vals[1:], SWEEP)
