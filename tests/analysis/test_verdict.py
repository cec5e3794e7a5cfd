"""Verdicts (logra/analysis/verdict.py): intervals that cover at the default design, the right call
on constructed cases, and errors that name what is missing."""
import json

import numpy as np
import pytest
from scipy import stats

from logra.analysis import verdict


@pytest.mark.parametrize("seed_sd", [0.02, 0.04])
def test_t_interval_covers_at_three_seeds(seed_sd):
    """The default design (3 seeds, 1,000 problems, seed-level spread like the measured one):
    the chosen interval covers the true difference in 93-97% of 10,000 simulations."""
    assert 0.93 <= verdict.coverage("t", seed_sd=seed_sd, sims=10_000) <= 0.97


def test_a_percentile_bootstrap_would_under_cover():
    """Why the t-interval: over 3 seeds a percentile bootstrap under-covers as the seed-level
    spread grows (300 simulations: the Monte Carlo sd is 0.015)."""
    assert verdict.coverage("bootstrap", seed_sd=0.04, sims=300) < 0.93


def test_iqm_is_scipys_trimmed_mean():
    x = np.random.default_rng(0).normal(size=37)
    assert verdict.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25), abs=1e-12)
    assert verdict.iqm([1, 2, 3, 100]) == 2.5


@pytest.mark.parametrize("lo, hi, expected", [
    (-0.01, 0.03, "non-inferior"),   # the whole interval above -margin
    (-0.05, -0.03, "inferior"),      # wholly below
    (-0.03, 0.01, "inconclusive"),   # straddles -margin
    (-0.02, 0.01, "inconclusive"),   # touching the margin is not above it
])
def test_non_inferiority_call(lo, hi, expected):
    assert verdict.call(lo, hi, margin=0.02) == expected


def _eval(path, scores):
    path.write_text(json.dumps({"accuracy": float(np.mean(scores)), "n": len(scores),
                                "samples": [{"doc_id": i, "acc": a}
                                            for i, a in enumerate(scores)]}))
    return path


def _design(tmp_path, method_scores, n=40, seeds=(0, 1, 2)):
    """Reference 'ref' answers the first half of the problems; 'm' answers `method_scores[s]`
    problems; the base answers a quarter."""
    evals = {}
    for s in seeds:
        evals["t", "ref", s] = _eval(tmp_path / f"ref{s}.json", [1] * (n // 2) + [0] * (n // 2))
        k = method_scores[s]
        evals["t", "m", s] = _eval(tmp_path / f"m{s}.json", [1] * k + [0] * (n - k))
    base = {"t": _eval(tmp_path / "base.json", [1] * (n // 4) + [0] * (n - n // 4))}
    return evals, base


def test_verdicts_pair_by_seed_and_problem(tmp_path):
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})  # +0, +1, +2 problems of 40
    row = verdict.verdicts(evals, base, "ref", 0.02).iloc[0]
    assert row["diff_mean"] == pytest.approx(1 / 40)
    mean, lo, hi = verdict.t_interval([0, 1 / 40, 2 / 40])
    assert (row["diff_lo"], row["diff_hi"]) == pytest.approx((lo, hi))
    assert row["p_better"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert row["gain_mean"] == pytest.approx(21 / 40 - 10 / 40) and row["informative"]
    assert row["call"] == verdict.call(lo, hi, 0.02)


def test_a_missing_seed_or_problem_is_named(tmp_path):
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})
    del evals["t", "m", 2]
    with pytest.raises(ValueError, match=r"t: m has seeds \[0, 1\], ref has \[0, 1, 2\]"):
        verdict.verdicts(evals, base, "ref", 0.02)
    evals, base = _design(tmp_path, {0: 20, 1: 21, 2: 22})
    _eval(evals["t", "m", 1], [1] * 39)  # one problem fewer
    with pytest.raises(ValueError, match=r"t/seed1: m vs ref: problems \[39\]"):
        verdict.verdicts(evals, base, "ref", 0.02)


def test_seeds_to_halve():
    # t(2)/sqrt(3) = 2.484; t(3)/sqrt(4) = 1.591; t(4)/sqrt(5) = 1.2415 <= 2.484 / 2
    assert verdict.seeds_to_halve([0.0, 0.01, 0.02]) == 5
