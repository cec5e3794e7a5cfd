"""Aggregation tables built from run summaries and lm-eval JSONs as the workflow writes them."""
import json
import random

import pytest

from logra.report import lr_sweep_table


def _write(path, payload):
    path.write_text(json.dumps(payload))
    return path


def test_lr_sweep_chooses_by_validation_accuracy_not_training_reward(tmp_path):
    sweep = {"adam": ("adam", 1e-4), "adam_hi": ("adam", 1e-3), "adam_top": ("adam", 1e-2),
             "rule": ("rule", 1e-4), "rule_hi": ("rule", 1e-3)}
    rng = random.Random()
    # (run name, seed) -> (status, final training reward, validation accuracy)
    base = rng.uniform(0.2, 0.5)
    runs = {("adam", 0): ("ok", 0.9, base), ("adam", 1): ("ok", 0.9, base + 0.02),
            ("adam_hi", 0): ("ok", 0.1, base + 0.10), ("adam_hi", 1): ("ok", 0.1, base + 0.12),
            # counted over ok seeds only: with its diverged seed it would be chosen
            ("adam_top", 0): ("ok", 0.5, base + 0.105), ("adam_top", 1): ("diverged", 0.0, 0.99),
            ("rule", 0): ("ok", 0.3, base), ("rule_hi", 0): ("ok", 0.4, base)}  # a tie
    run_jsons, val_jsons = [], []
    for (name, seed), (status, reward, acc) in runs.items():
        run_jsons.append(_write(tmp_path / f"{name}{seed}_run.json", {
            "method": name, "seed": seed, "status": status, "final_reward": reward}))
        val_jsons.append(_write(tmp_path / f"{name}{seed}_val.json", {"accuracy": acc}))
    table = lr_sweep_table(run_jsons, val_jsons, sweep).set_index(["method", "lr"])
    assert table.loc[("adam", 1e-3), "val_accuracy_mean"] == pytest.approx(base + 0.11)
    assert table.loc[("adam", 1e-2), ["n_ok", "n_seeds"]].tolist() == [1, 2]
    assert table.loc[("adam", 1e-2), "val_accuracy_mean"] == pytest.approx(base + 0.105)
    chosen = table[table["chosen"]].index.tolist()
    assert chosen == [("adam", 1e-3), ("rule", 1e-4)]  # one per method; a tie: the smaller lr
    with pytest.raises(ValueError):  # every run needs its evaluation
        lr_sweep_table(run_jsons, val_jsons[:-1], sweep)
