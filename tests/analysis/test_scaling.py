"""The scaling table (logra/analysis/scaling.py): per size the paired difference and its call,
the ratios and the band; over sizes the trend's slope with an interval that holds 0 when the
difference does not move with size."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from logra.analysis.scaling import cost_row, scaling_table, slope, trend_call

SIZES = {"s0": 1e5, "s1": 1e6, "s2": 1e7}  # parameters: one decade apart


def test_slope_recovers_a_line_and_its_interval_shrinks_with_noise():
    x = np.repeat([5.0, 6.0, 7.0], 3)
    b, lo, hi = slope(x, 0.02 * x - 0.1)
    assert b == pytest.approx(0.02) and lo == pytest.approx(0.02) and hi == pytest.approx(0.02)
    noise = np.random.default_rng(0).normal(0, 0.01, len(x))
    b, lo, hi = slope(x, 0.02 * x + noise)
    assert lo < b < hi and lo < 0.02 < hi
    assert trend_call(lo, hi) == ("difference rises with size" if lo > 0 else "undetermined")
    assert trend_call(-0.2, -0.1) == "difference falls with size"
    assert math.isnan(slope([1.0, 2.0], [0.0, 1.0])[1])  # two points: no interval


def _eval(path, scores):
    path.write_text(json.dumps({"primary": "sampled", "problems": [
        {"doc_id": i, "sampled": {"acc": float(v)}} for i, v in enumerate(scores)]}))
    return path


def _summary(path, n_params, peak, step_s):
    path.write_text(json.dumps({"n_params": n_params, "peak_mem_bytes": peak,
                                "mean_step_time_s": step_s}))
    return path


def _runs(tmp_path, gap, base_level=0.3, seeds=(0, 1, 2)):
    """Two methods at three sizes: the reference at 0.4 on 50 problems, `method` at
    0.4 + gap(size, seed) (whole problems moved), the bases at `base_level`; the method's peak
    half the reference's and its step 1.5x as long."""
    rows, bases = [], {}
    for size, n in SIZES.items():
        for seed in seeds:
            for label, level, peak, t in (("ref", 0.4, 100, 1.0),
                                          ("method", 0.4 + gap(size, seed), 50, 1.5)):
                k = round(level * 50)
                stem = tmp_path / f"{label}_{size}_{seed}"
                rows.append({"label": label, "size": size, "seed": seed,
                             "eval": _eval(stem.with_suffix(".eval"), [1] * k + [0] * (50 - k)),
                             "summary": _summary(stem.with_suffix(".json"), int(n), peak, t)})
            k = round(base_level * 50)
            bases[size, seed] = _eval(tmp_path / f"base_{size}_{seed}", [1] * k + [0] * (50 - k))
    return pd.DataFrame(rows), bases


def test_each_size_pairs_the_seeds_and_the_trend_follows_the_gap(tmp_path):
    # the gap grows by 0.04 per decade, with seed noise of +-0.02
    runs, bases = _runs(tmp_path, lambda size, seed: -0.08 + 0.04 * list(SIZES).index(size)
                        + 0.02 * (seed - 1))
    t = scaling_table(runs, bases, "ref", margin=0.02, band=(0.2, 0.36))
    measured = t[t["kind"] == "measured"].set_index("size")
    assert list(measured.index) == list(SIZES)
    assert measured["diff_mean"].tolist() == pytest.approx([-0.08, -0.04, 0.0])
    assert measured["call"].tolist()[0] == "inferior"  # [-0.13, -0.03] below -0.02
    assert (measured["diff_lo"] < measured["diff_mean"]).all()
    assert measured["memory_ratio"].tolist() == pytest.approx([0.5] * 3)
    assert measured["step_time_ratio"].tolist() == pytest.approx([1.5] * 3)
    assert measured["base_mean"].tolist() == pytest.approx([0.3] * 3)
    assert measured["base_in_band"].all()
    assert measured["ref_gain_mean"].tolist() == pytest.approx([0.1] * 3)
    trend = t[t["kind"] == "trend"].iloc[0]
    assert trend["slope_per_decade"] == pytest.approx(0.04)
    assert trend["slope_lo"] > 0 and trend["call"] == "difference rises with size"
    assert (trend["sizes"], trend["df"]) == (3, 1)  # the size is the unit, not the seed


def test_a_gap_that_does_not_move_with_size_is_undetermined_and_bases_off_band_flagged(
        tmp_path):
    runs, bases = _runs(tmp_path, lambda size, seed: 0.02 * (seed - 1)
                        + (0.02 if size == list(SIZES)[1] else 0.0), base_level=0.1)
    t = scaling_table(runs, bases, "ref", margin=0.02, band=(0.2, 0.36))
    trend = t[t["kind"] == "trend"].iloc[0]
    assert trend["slope_lo"] < 0 < trend["slope_hi"] and trend["call"] == "undetermined"
    assert not t[t["kind"] == "measured"]["base_in_band"].any()


def test_a_seed_without_both_runs_stops_naming_the_size(tmp_path):
    runs, bases = _runs(tmp_path, lambda size, seed: 0.0)
    runs = runs.drop(runs[(runs["label"] == "method") & (runs["size"] == "s1")
                          & (runs["seed"] == 2)].index)
    with pytest.raises(ValueError, match=r"s1: method has seeds \[0, 1\], ref has \[0, 1, 2\]"):
        scaling_table(runs, bases, "ref", margin=0.02, band=(0.2, 0.36))


def test_the_cost_is_the_benchmarks_cpu_time_against_the_cap(tmp_path):
    paths = []
    for i, cpu in enumerate([1800.0, 3600.0]):
        paths.append(tmp_path / f"{i}.tsv")
        paths[-1].write_text(f"s\tcpu_time\n{cpu + 5}\t{cpu}\n")
    row = cost_row(paths, cap_hours=1.0).iloc[0]
    assert row["cpu_hours"] == pytest.approx(1.5) and not row["within_cap"]
    assert cost_row(paths, cap_hours=2.0).iloc[0]["within_cap"]


def test_the_report_states_each_size_the_trend_the_predictions_and_the_cost(tmp_path):
    from types import SimpleNamespace

    from logra.analysis.report import _scaling
    from logra.analysis.scaling import predicted_ratios, validation_rows
    runs, bases = _runs(tmp_path, lambda size, seed: 0.02 * (seed - 1))
    bench = tmp_path / "b.tsv"
    bench.write_text("s\tcpu_time\n10\t7200\n")
    table = pd.concat([scaling_table(runs, bases, "ref", margin=0.02, band=(0.2, 0.36)),
                       predicted_ratios({("big", "ref"): {"total": 4.0, "n_params": 1e10},
                                         ("big", "method"): {"total": 1.0, "n_params": 1e10}},
                                        "ref"),
                       validation_rows(*[pd.DataFrame({
                           "method": ["method"] * 3, "option": ["lr"] * 3,
                           "lr": [x, 2 * x, 4 * x], "val_accuracy_mean": [0.3, 0.35, 0.32],
                           "chosen": [False, True, False], "on_edge": [False] * 3})
                           for x in (1e-4, 5e-5)], {"method": 2e-4}, ("s0", "s1"),
                           [0.5, 1, 2]),
                       cost_row([bench], 8.0)], ignore_index=True)
    text = "\n".join(_scaling(SimpleNamespace(scaling=table)))
    for size in SIZES:
        assert f"| {size} |" in text
    assert "+0.000 [" in text and "undetermined" in text
    assert "method at big 0.25" in text
    assert "method at s0: the sweep chose lr 0.0002; the config adopted 0.0002" in text
    assert "method at s1: of the transferred lr times each factor, x1 scored best" in text
    assert "CPU time: 2.00 h over 1 jobs, against a cap of 8 h (within it)" in text
    assert "does not speak for 1.5B-27B" in text
    assert "has not run" in "\n".join(_scaling(SimpleNamespace(scaling=None)))


def test_the_trend_has_the_degrees_of_freedom_of_its_sizes_not_of_its_seeds(tmp_path):
    """Seeds that agree within each size, sizes that wobble about a rising line: a fit over
    the 9 (size, seed) points would call a rise (df 7, its interval clear of 0); over the 3
    size means (df 1) the trend is undetermined."""
    wobble = dict(zip(SIZES, (-0.08, 0.0, -0.02)))
    runs, bases = _runs(tmp_path, lambda size, seed: wobble[size] + 0.02 * (seed == 1))
    t = scaling_table(runs, bases, "ref", margin=0.02, band=(0.2, 0.36))
    trend = t[t["kind"] == "trend"].iloc[0]
    assert trend["call"] == "undetermined" and trend["df"] == 1
    x = np.repeat(np.log10([float(n) for n in SIZES.values()]), 3)
    y = [wobble[z] + 0.02 * (s == 1) for z in SIZES for s in range(3)]
    assert slope(x, y)[1] > 0  # what the per-seed fit would have claimed
