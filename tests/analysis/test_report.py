"""Aggregation tables built from run summaries and lm-eval JSONs as the workflow writes them."""
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from logra.analysis.figures import BAND_METHODS
from logra.files import write_json

def _bench(root: Path, rel: str, seconds: float) -> Path:
    path = root / "results/benchmarks" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:00\t1.0\n")
    return path


def test_time_ledger_sums_each_stage_and_shares_add_up(tmp_path):
    from logra.analysis.tables import time_ledger
    files = [_bench(tmp_path, "data/data/a.tsv", 1.5),
             _bench(tmp_path, "train/train/a/m/seed0.tsv", 6.0),
             _bench(tmp_path, "train/train/a/m/seed1.tsv", 2.0),
             _bench(tmp_path, "figures/f.tsv", 0.5)]
    ledger = time_ledger(files).set_index("stage")
    assert list(ledger.index) == ["data", "train", "figures"]  # in the order jobs were listed
    assert ledger.loc["train", "jobs"] == 2 and ledger.loc["train", "seconds"] == 8.0
    assert ledger["seconds"].sum() == 10.0 and ledger["share"].sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no benchmark files"):
        time_ledger([])


def test_report_formats_every_number_from_the_tables_and_leaves_out_what_did_not_run(tmp_path):
    import pandas as pd

    from logra.analysis.report import ReportInputs, report_markdown
    from logra.analysis.tables import time_ledger
    summary = pd.DataFrame({
        "status": ["ok", "ok", "oom"], "task": "a", "method": ["dense_adam", "logra", "logra"],
        "seed": [0, 0, 1], "device": "cpu", "n_params": 1_360_000, "model": "tiny", "steps": 80,
        "sync_bytes_per_step": [4 * 2**20, 2**19, None], "sync_full_bytes": 4 * 2**20,
        "peak_mem_bytes": [8 * 2**20, 4 * 2**20, None],
        "optimizer_state_bytes": [2 * 2**20, 2**19, None], "mean_step_time_s": [0.5, 0.25, None],
        **_sync_columns(["full", "low_rank", "low_rank"], [4 * 2**20] * 3, [2**20] * 3,
                        [None, 2**19, 2**19])})
    accuracy = pd.DataFrame({"task": ["a", "a"], "method": ["dense_adam", "logra"],
                             "base_accuracy": [0.25, 0.25], "accuracy_mean": [0.4375, 0.5],
                             "accuracy_sd": [0.0211, float("nan")], "gain_mean": [0.1875, 0.25],
                             "n_seeds": [3, 1], "metric": "sampled", "eval_greedy": [0.45, 0.5],
                             "base_greedy": [0.3, 0.3],
                             "peak_mem_bytes_mean": [8 * 2**20, 4 * 2**20],
                             "token_entropy": [0.27, 0.35]})
    machine = {"cpu_model": "Some CPU", "cpu_vendor": "GenuineIntel", "torch": "2.x",
               "torch_capability": "AVX2", "transformers": "5.x", "reproducible": True}
    ledger = time_ledger([_bench(tmp_path, "data/data/a.tsv", 1.0),
                          _bench(tmp_path, "train/train/a.tsv", 3.0)])
    sft = [{"task": "a", "seed": s, "history": [{"step": 25, "accuracy": 0.1 + s},
                                                {"step": 50, "accuracy": 0.125}][:2 - s]}
           for s in (1, 0)]
    text = report_markdown(ReportInputs(summary, accuracy, [{"machine": machine}], [], ledger,
                           reference="dense_adam", sft=sft))
    assert ("cpu, 1.36M params (tiny), 80 GRPO steps, 2 seeds (0, 1); 2 of 3 runs finished ok"
            in text)
    # each base's SFT curve, by seed; a step a base did not log is left blank
    assert "| task | seed | step 25 | step 50 |" in text
    assert "| a | 0 | 0.100 | 0.125 |\n| a | 1 | 1.100 |  |" in text
    assert "Some CPU (GenuineIntel; torch 2.x at AVX2" in text
    assert "| a | 0.250 | 0.300 |" in text  # the base, by the primary metric and greedy
    assert "`sampled` (the primary metric)" in text
    # beside the primary metric: greedy, then the token entropy
    assert "| a | dense_adam | 0.438 ± 0.021 | +0.188 | 0.450 | 0.270 | 3 |" in text
    assert "| a | logra | 0.500 ± n/a | +0.250 | 0.500 | 0.350 | 1 |" in text  # one seed: no sd
    # measured cost: of the runs that finished ok, peak vs the reference's on the same task
    assert "| a | dense_adam | 8.00 | 1.000 | 2.000 | 0.500 | 4.0000 | 1 |" in text
    assert "| a | logra | 4.00 | 0.500 | 0.500 | 0.250 | 0.5000 | 1 |" in text
    # accuracy and memory: the interval is t(0.975, 2) x 0.0211 / sqrt(3) = 0.052 wide each side
    assert "| a | dense_adam | 0.438 [0.385, 0.490] | 3 | 8.00 | 1.000 |" in text
    assert "| a | logra | 0.500 [n/a, n/a] | 1 | 4.00 | 0.500 |" in text
    assert "PREDICTION" not in text  # no planner in this config
    # sync: of the runs that finished ok; low-rank over dense Adam's delta, same task and seed
    assert "| logra | low_rank | yes | float32 | 0.5000 |" in text
    assert ("logra's low-rank sync sends 0.5x the bytes per step of dense_adam's delta sync "
            "(same task and seed), one (task, seed) pair") in text
    assert "The sync regime runs have not run" in text
    assert "| train | 1 | 3.0 | 75.0% |" in text and "| total | 2 | 4.0 | 100.0% |" in text
    for absent in ("## Verdicts", "## Memory sweep", "## Planner", "## lr sweep"):
        assert absent not in text  # not in the config, or not run
    assert "The lr sweep has not run" in text
    assert "LoGRA in TRL has not run" in text
    assert "The ablations have not run" in text

    lr_sweep = pd.DataFrame({"task": ["a", "a"], "method": "logra", "lr": [1e-4, 2.5e-4],
                             "val_accuracy_mean": [0.3, 0.35], "val_accuracy_sd": [0.01, 0.02],
                             "n_seeds": 3, "chosen": [False, True], "budget": 6,
                             "metric": "sampled", "option": "kl_budget",
                             "at_cap_share": [0.0, 0.125], "on_edge": [False, True],
                             "declared": [True, False], "bracketed": False})
    planner = pd.DataFrame({"model": ["m32b"], "method": ["logra"], "gpus": [8], "policy": "bf16",
                            "total": [61.2e9], "peak_phase": ["forward_backward"],
                            "gpu_bytes": [80e9], "fits": [True], "sync_bytes": [1.5e8]})
    calibrated = summary.assign(kl_eta_1_steps=[None, 40, None], kl_eta_1_median=[None, 1.02, None],
                                kl_eta_1_p10=[None, 0.5, None], kl_eta_1_p90=[None, 1.9, None],
                                kl_eta_below_1_steps=[None, 0, None], kl_eta_below_1_median=None,
                                kl_eta_below_1_p10=None, kl_eta_below_1_p90=None,
                                control=[None, "BudgetControl", None],
                                steps_at_cap_share=[None, 0.25, None],
                                control_seconds=[None, 0.05, None],
                                cosine_step=[None, 40, None], update_cosine=[None, 0.21, None])
    trl = {"task": "a", "device": "cpu", "model": {"n_params": 1_360_000}, "steps": 40,
           "reward_window_steps": 10, **{m: {"peak_mem_bytes": peak * 2**20,
                                             "optimizer_state_bytes": state * 2**20,
                                             "reward_first": 0.3, "reward_last": last}
                                         for m, peak, state, last in (("logra", 30, 0.5, 0.4),
                                                                      ("adamw", 40, 10, 0.375))}}
    peer = summary.iloc[:1].assign(method="adamw_8bit", peak_mem_bytes=6 * 2**20)
    ablations = {"summary": pd.concat([summary, peer]), "verdicts": None, "sweep": None,
                 "accuracy": accuracy.iloc[:1].assign(method="adamw_8bit", accuracy_mean=0.375)}
    text = report_markdown(ReportInputs(calibrated, accuracy, [{"machine": machine}], [], ledger,
                           planner=planner, lr_sweep=lr_sweep, trl=[trl], reference="dense_adam",
                           ablations=ablations))
    assert "## Ablations: accuracy (`results/ablations/accuracy.csv`)" in text
    assert "| a | adamw_8bit | 0.375 ± 0.021 | +0.188 | 0.450 | 0.270 | 3 |" in text
    assert "| a | adamw_8bit | 6.00 | 0.750 | 2.000 | 0.500 | 4.0000 | 1 |" in text
    assert "## Ablations: sync (`results/ablations/summary.csv`)" in text
    assert "## Ablations: verdicts" not in text and "The ablations have not run" not in text
    assert "| a | logra | cpu | 1360000 | 40 | 30.00 | 0.750 | 0.500 | 0.300 / 0.400 (10) |" in text
    assert "| a | adamw | cpu | 1360000 | 40 | 40.00 | 1.000 | 10.000 | 0.300 / 0.375 (10) |" in text
    assert "| m32b | logra | 8 | bf16 | 61.2 | forward_backward | 80 | True | 0.15 |" in text
    assert ("| a | logra | 40 | 0 | 0 | 1.02 [0.50, 1.90] | n/a [n/a, n/a] | n/a [n/a, n/a] |"
            in text)  # calibration
    # the step's control: how often at its cap, its seconds beside the step's
    assert "## Step control (`results/summary.csv`)" in text
    step_s = calibrated.loc[1, "mean_step_time_s"]
    assert (f"| a | logra | BudgetControl | 25% | 0.050 | {step_s:.3f} | "
            f"{0.05 / step_s:.0%} |") in text
    assert "## Update vs gradient (`results/summary.csv`)" in text
    assert "| a | logra | 40 | 0.210 [0.210, 0.210] | 1 |" in text
    assert "| a | logra | kl_budget | 0.00025 | 6 | 1 | no | 12% | 0.350 ± 0.020 | 3 |" in text
    assert "0.0001 |" not in text


def test_paper_setting_table_sets_each_prediction_beside_its_published_reduction():
    """Per setting and logits, the first method is the reference: the reduction is one minus
    the ratio of predicted totals, the published reduction comes from the published GiB when
    both methods have one (else the setting's), and the reduction without the method's peak
    phase uses its next largest phase."""
    import pandas as pd

    from logra.analysis.tables import paper_setting_table
    gib = 2**30
    rows = []
    for setting, published in (("s1", {}), ("s2", {"dense": 40.0, "logra": 30.0})):
        for logits in ("chunked", "full"):
            for method, total, phases in (("dense", 10 * gib, (10, 8)), ("logra", 6 * gib, (4, 6))):
                rows.append({"setting": setting, "logits": logits, "method": method,
                             "seq_len": 4096, "gpus": 4, "total": total,
                             "peak_phase": "forward_backward" if method == "dense"
                             else "kl_control",
                             "phase_forward_backward": phases[0] * gib,
                             "phase_kl_control": phases[1] * gib if method == "logra" else None,
                             "n_params": 1000 * gib, "low_rank_params": 900 * gib,
                             "published_gib": published.get(method),
                             "published_reduction": 0.457 if setting == "s1" else None,
                             "published_source": "src"})
    t = paper_setting_table(pd.DataFrame(rows))
    assert list(zip(t["setting"], t["logits"], t["method"])) == [
        ("s1", "chunked", "logra"), ("s1", "full", "logra"), ("s2", "chunked", "logra"),
        ("s2", "full", "logra")]
    assert t["reduction"].tolist() == pytest.approx([0.4] * 4)
    assert t["reduction_without_peak_phase"].tolist() == pytest.approx([0.6] * 4)
    assert t["published_reduction"].tolist() == pytest.approx([0.457, 0.457, 0.25, 0.25])
    assert t["frozen_adamw_gib"].tolist() == pytest.approx([12 * 100 / 4] * 4)


def test_the_paper_setting_curve_finds_the_length_that_gives_the_published_reduction():
    """Per setting, logits and method: the reduction at each longest length, and the length
    where the curve meets the published reduction, linearly between neighbours; none where
    the curve does not reach it."""
    import pandas as pd

    from logra.analysis.tables import paper_setting_curve
    rows = [{"setting": s, "logits": "full", "method": m, "longest_len": n,
             "total": total, "published_gib": None, "published_reduction": 0.45}
            for s, scale in (("s1", 1.0), ("s2", 0.5))
            for n, dense, logra in ((512, 10.0, 5.0), (1024, 12.0, 7.2), (2048, 16.0, 11.2))
            for m, total in (("dense", dense), ("logra", logra * (1 + scale) / 2 if s == "s2"
                                                          else logra))]
    c = paper_setting_curve(pd.DataFrame(rows))
    s1 = c[c["setting"] == "s1"]
    assert s1["reduction"].tolist() == pytest.approx([0.5, 0.4, 0.3])
    assert s1["published_at"].iloc[0] == pytest.approx(512 + 0.5 * 512)  # 0.45: halfway
    s2 = c[c["setting"] == "s2"]  # 0.625, 0.55, 0.475: never 0.45
    assert s2["published_at"].isna().all() and (s2["reference"] == "dense").all()


def _sync_columns(transports, full, delta, low_rank, seconds=0.01, changed=0.5, mismatch=1e-3):
    """summary.csv's sync columns for runs applying `transports`, with these bytes per step."""
    return {"sync_transport": transports, "rollout_dtype": "float32",
            "sync_bytes_full_per_step": full, "sync_bytes_delta_per_step": delta,
            "sync_bytes_low_rank_per_step": low_rank, "sync_seconds_per_step": seconds,
            "sync_changed_fraction_per_step": changed, "logp_mismatch_mean": mismatch,
            "logp_mismatch_max": mismatch}


def test_sync_table_and_ratio_equal_a_direct_computation():
    """Per method and transport: the mean over ok runs of each transport's bytes; seconds and
    mismatch of the applied transport only; low-rank over the reference's delta, paired by
    task and seed, and over the delta of its own updates."""
    import math

    import pandas as pd

    from logra.analysis.report import low_rank_sentence
    from logra.analysis.tables import low_rank_vs_delta, sync_table
    runs = [  # (status, task, method, seed, transport, full, delta, low_rank, seconds, mismatch)
        ("ok", "a", "dense", 0, "delta", 800, 300, None, 0.1, 0.0),
        ("ok", "a", "dense", 1, "delta", 800, 500, None, 0.3, 0.0),
        ("ok", "b", "dense", 0, "delta", 800, 100, None, 0.2, 0.0),
        ("ok", "a", "lowr", 0, "low_rank", 800, 400, 150, 0.05, 2e-3),
        ("ok", "a", "lowr", 1, "low_rank", 800, 600, 250, 0.07, 4e-3),
        ("ok", "b", "lowr", 0, "low_rank", 800, 200, 120, 0.06, 6e-3),
        ("diverged", "b", "lowr", 1, "low_rank", 800, 9e9, 9e9, 9.0, 9.0)]
    summary = pd.DataFrame(runs, columns=[
        "status", "task", "method", "seed", "sync_transport", "sync_bytes_full_per_step",
        "sync_bytes_delta_per_step", "sync_bytes_low_rank_per_step", "sync_seconds_per_step",
        "logp_mismatch_mean"]).assign(logp_mismatch_max=lambda d: 2 * d["logp_mismatch_mean"],
                                      sync_changed_fraction_per_step=0.25,
                                      rollout_dtype="bfloat16")
    t = sync_table(summary).set_index(["method", "transport"])
    assert sorted(t.index) == [("dense", "delta"), ("dense", "full"), ("lowr", "delta"),
                               ("lowr", "full"), ("lowr", "low_rank")]  # dense: no low_rank
    assert t.loc[("dense", "delta"), "bytes_per_step"] == (300 + 500 + 100) / 3
    assert t.loc[("lowr", "low_rank"), "bytes_per_step"] == (150 + 250 + 120) / 3  # ok runs
    assert t.loc[("lowr", "delta"), "bytes_per_step"] == (400 + 600 + 200) / 3
    assert t.loc[("dense", "delta"), "sync_seconds"] == pytest.approx(0.2)
    assert t.loc[("lowr", "low_rank"), "logp_mismatch_mean"] == pytest.approx(4e-3)
    assert t.loc[("lowr", "low_rank"), "logp_mismatch_max"] == pytest.approx(8e-3)
    assert math.isnan(t.loc[("lowr", "delta"), "sync_seconds"])  # not applied: not measured
    assert math.isnan(t.loc[("dense", "full"), "logp_mismatch_mean"])
    assert t.loc[("lowr", "full"), "applied"] == False and t.loc[("lowr", "low_rank"), "applied"]
    assert (t["runs"] == 3).all() and (t["changed_fraction"] == 0.25).all()

    r = low_rank_vs_delta(summary, "dense").set_index("vs")
    vs_dense = [150 / 300, 250 / 500, 120 / 100]  # (a, 0), (a, 1), (b, 0)
    assert r.loc["dense", "ratio"] == pytest.approx(sum(vs_dense) / 3)
    assert (r.loc["dense", "lo"], r.loc["dense", "hi"], r.loc["dense", "n"]) == (0.5, 1.2, 3)
    own = [150 / 400, 250 / 600, 120 / 200]
    assert r.loc["own updates", "ratio"] == pytest.approx(sum(own) / 3)
    text = low_rank_sentence(summary, "dense")
    assert (f"lowr's low-rank sync sends {sum(vs_dense) / 3:.3g}x the bytes per step of dense's "
            "delta sync (same task and seed), 0.5-1.2x over 3 (task, seed) pairs, bfloat16 "
            "engine: fewer in some pairs, more in others") in text
    assert f"{sum(own) / 3:.3g}x the bytes per step of the delta sync of its own updates" in text
    assert "fewer bytes in every pair" in text


def test_sync_bytes_figure_draws_measured_and_predicted_panels(tmp_path):
    import pandas as pd

    from logra.analysis.figures import sync_bytes
    summary = pd.DataFrame({
        "status": "ok", "task": "a", "method": ["dense_adam", "logra"], "seed": 0,
        "device": "cpu", "n_params": 1_360_000, "model": "tiny", "steps": 80,
        "sync_bytes_per_step": [4e6, 5e5],
        **_sync_columns(["delta", "low_rank"], [4e6, 4e6], [3e6, 2.5e6], [None, 5e5])})
    planner = pd.DataFrame({"model": "m27b", "method": ["dense_adam", "logra"], "policy": "bf16",
                            "sync_bytes": [54e9, 3e9], "sync_bytes_full": 54e9,
                            "sync_trained_words": 27e9})
    out = tmp_path / "sync_bytes.png"
    sync_bytes(summary, planner, [str(out)])
    assert out.stat().st_size > 0


def test_sync_regime_table_and_its_report_section(tmp_path):
    import pandas as pd

    from logra.analysis.report import ReportInputs, report_markdown
    from logra.analysis.tables import sync_regime_table, time_ledger
    paths = []
    for method, (knob, size), transport, low in (("d", ("lr", 1e-6), "delta", None),
                                                 ("l", ("update_ratio", 6e-5), "low_rank", 50)):
        path = tmp_path / method / "summary.json"
        path.parent.mkdir()
        write_json(path, {"status": "ok", "task": "a", "method": method, "seed": 0,
                          "config": {"method": {"options": {knob: size}}},
                          "step_size": {"option": knob, "value": size},
                          "base_median_abs_weight": 0.016, "sync_transport": transport,
                          "rollout_dtype": "bfloat16", "sync_bytes_full_per_step": 400,
                          "sync_bytes_delta_per_step": 100, "sync_bytes_low_rank_per_step": low,
                          "sync_seconds_per_step": 0.01, "sync_changed_fraction_per_step": 0.04,
                          "logp_mismatch_mean": 0.0, "logp_mismatch_max": 0.0})
        paths.append(path)
    table = sync_regime_table(paths, {"lr_7b": ["d", "l"]})
    assert list(table["regime"]) == ["lr_7b"] * 2
    # lr / median|w| for an lr; LoGRA's update_ratio is relative to ‖W‖ already
    assert table["lr_over_w"].iloc[0] == pytest.approx(1e-6 / 0.016)
    assert pd.isna(table["lr_over_w"].iloc[1]) and table["step_size"].iloc[1] == 6e-5
    summary = pd.DataFrame({"status": ["ok"], "task": "a", "method": ["d"], "seed": [0],
                            "device": "cpu", "n_params": 1, "model": "tiny", "steps": 20,
                            "peak_mem_bytes": 1e6, "optimizer_state_bytes": 1e5,
                            "mean_step_time_s": 0.1, "sync_bytes_per_step": 400,
                            **_sync_columns(["full"], [400], [100], [None])})
    accuracy = pd.DataFrame({"task": ["a"], "method": ["d"], "base_accuracy": [0.2],
                             "accuracy_mean": [0.3], "accuracy_sd": [0.0], "gain_mean": [0.1],
                             "metric": "sampled", "peak_mem_bytes_mean": [2**20],
                             "n_seeds": [1]})
    ledger = time_ledger([_bench(tmp_path, "data/data/a.tsv", 1.0)])
    text = report_markdown(ReportInputs(summary, accuracy, [], [], ledger, sync_regime=table))
    assert "## Sync regime: lr_7b (`results/sync_regime.csv`)" in text
    assert "median |w| of the base, measured: 0.016" in text
    assert "d lr 1e-06 (lr/median|w| 6.25e-05), l update_ratio 6e-05" in text
    assert "l's low-rank sync sends 0.5x the bytes per step of d's delta sync" in text


@pytest.mark.parametrize("n_methods", [2, BAND_METHODS, BAND_METHODS + 1, 15])
def test_reward_curves_give_each_method_its_own_colour_and_bands_only_when_few(
        tmp_path, monkeypatch, n_methods):
    """Every method gets a colour no other method has (the ablations draw 15); the ± sd bands,
    which hide one another when many overlap, are drawn for at most BAND_METHODS methods."""
    import pandas as pd
    from matplotlib.collections import PolyCollection

    from logra.analysis import figures
    paths = []
    for m in range(n_methods):
        for seed in (0, 1):
            p = tmp_path / "runs" / "a" / f"method{m}" / f"seed{seed}" / "metrics.csv"
            p.parent.mkdir(parents=True)
            pd.DataFrame({"step": [1, 2, 3], "reward_mean": [0.1 * m, 0.2, 0.3 + seed]}
                         ).to_csv(p, index=False)
            paths.append(p)
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, outputs: drawn.update(fig=fig))
    summary = pd.DataFrame({"status": "ok", "device": "cpu", "n_params": 1_360_000,
                            "model": "tiny", "steps": 3, "seed": [0, 1]})
    figures.reward_curves(summary, paths, [str(tmp_path / "r.png")])
    ax = drawn["fig"].axes[0]
    colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
    assert len(colours) == n_methods and len(set(map(str, colours.values()))) == n_methods
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == (n_methods if n_methods <= figures.BAND_METHODS else 0)


def test_report_prints_the_analysis_plan_first_and_the_gate_and_power_of_each_verdict(tmp_path):
    import pandas as pd

    from logra.analysis.report import ReportInputs, report_markdown
    from logra.analysis.tables import time_ledger
    from logra.analysis.verdict import analysis_plan
    summary = pd.DataFrame({"status": ["ok"], "task": "a", "method": ["d"], "seed": [0],
                            "device": "cpu", "n_params": 1000, "model": "tiny", "steps": 80,
                            "peak_mem_bytes": 2**20, "optimizer_state_bytes": 2**19,
                            "mean_step_time_s": 0.1, "sync_bytes_per_step": 2**20,
                            **_sync_columns(["full"], [2**20], [2**20], [None])})
    accuracy = pd.DataFrame({"task": ["a"], "method": ["d"], "base_accuracy": [0.2],
                             "accuracy_mean": [0.3], "accuracy_sd": [0.0], "gain_mean": [0.1],
                             "metric": "sampled",
                             "n_seeds": [1], "metric": "sampled", "peak_mem_bytes_mean": [2**20]})
    margins = pd.DataFrame([{"task": "a", "margin": 0.03, "source": "max(floor, ...)",
                             "val_gain_mean": 0.06, "val_gain_by_seed": "seed 10: +0.0600",
                             "val_seeds": 1, "val_problems": 50, "lr": 1e-4,
                             "metric": "sampled"}])
    protocols = {"greedy": {"samples": 1, "temperature": 0, "top_p": 1.0},
                 "sampled": {"samples": 4, "temperature": 0.7, "top_p": 0.7}}
    plan = analysis_plan({"reference": "d", "methods": ["d", "l"], "ablation_methods": [],
                          "tasks": ["a"], "seeds": [0, 1, 2], "n_test": 1000,
                          "steps": {"d": 80, "l": 80}, "method_config": {},
                          "tuned": {"a": {"l": {"option": "kl_budget", "value": 3.2e-3,
                                                "bracketed": True},
                                          "d": {"option": "lr", "value": 4e-4,
                                                "bracketed": False}}},
                          "eval": {"primary": "sampled", "protocols": protocols},
                          "verdict": {"gate": {"alpha": 0.05}}}, margins)
    verdicts = pd.DataFrame([
        {"task": "a", "method": "l", "reference": "d", "statistic": "mean", "metric": "sampled",
         "diff_mean": -0.01, "diff_lo": -0.02, "diff_hi": 0.0, "margin": 0.03,
         "call": "non-inferior", "ref_gain_by_seed": "seed 0: +0.0500 (p 0.001)",
         "diff_by_seed": "seed 0: -0.0100", "calls": "worse: no; non-inferior at 0.030: yes; equivalent within ±0.030: yes",
         "gain_share": 0.8, "gain_share_lo": 0.5, "gain_share_hi": float("nan"),
         "gate_passed": "1/1", "gate_p": 0.002, "informative": True,
             "seeds_needed": 4.0},
        {"task": "all", "method": "l", "reference": "d", "statistic": "IQM", "metric": "sampled",
         "diff_mean": -0.01, "diff_lo": -0.03, "diff_hi": 0.01, "margin": None,
         "call": "none (descriptive interval)", "ref_gain_by_seed": None, "diff_by_seed": None,
         "gate_passed": None,
         "informative": None, "seeds_needed": None}])
    ledger = time_ledger([_bench(tmp_path, "data/data/a.tsv", 1.0)])
    text = report_markdown(ReportInputs(summary, accuracy, [], [], ledger, plan=plan,
                                        verdicts=verdicts))
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Analysis plan (`results/analysis_plan.json`)"
    assert ("- Primary metric: `sampled`, 4 samples at temperature 0.7, top-p 0.7; per problem "
            "the mean reward over its samples") in text
    assert "Reported beside it: `greedy` (greedy)." in text
    assert "- Compared: l against `d`, on a, seeds 0, 1, 2, 1000 test problems" in text
    assert ("- Tuned on the validation split (config/tuned.yaml): l on a, kl_budget 0.0032 "
            "(bracketed); d on a, lr 0.0004 (on its grid's edge: a bound).") in text
    assert ("| a | 0.0300 | +0.0600 | seed 10: +0.0600 | 50 | 0.0001 | max(floor, ...) |"
            in text)
    assert ("| a | l | d | -0.010 [-0.020, +0.000] | seed 0: -0.0100 | 0.030 | worse: no; non-inferior at "
            "0.030: yes; equivalent within ±0.030: yes | 0.80 [0.50, n/a] | seed 0: +0.0500 "
            "(p 0.001) | 0.002 | 1/1 | yes | 4 |") in text
    assert "answers (Holm over 1)" in text
    assert "l -0.010 [-0.030, +0.010]." in text  # the IQM, without a call

    # a grid without its reference compares nothing, and says so; opt-in results made under
    # another config are listed as stale, not shown
    alone = analysis_plan({
        "reference": "d", "methods": ["l"], "ablation_methods": [], "tasks": ["a"],
        "seeds": [0, 1, 2], "n_test": 1000, "steps": {"l": 80}, "method_config": {},
        "eval": {"primary": "sampled", "protocols": protocols},
        "verdict": {"gate": {"alpha": 0.05}}}, margins)
    text = report_markdown(ReportInputs(summary, accuracy, [], [], ledger, plan=alone, stale=[
        {"result": "results/trl/countdown.json", "config_digest": "abc", "target": "trl",
         "why": "made under another config"}],
        digest="def"))
    assert ("- Compared: nothing (runs l; the reference, `d` (verdict.reference), is not among "
            "them), on a") in text
    assert "- Config digest: `def`." in text
    assert "(config/tuned.yaml): nothing adopted; every value as config/config.yaml" in text
    assert ("| `results/trl/countdown.json` | `abc` | made under another config | "
            "`snakemake --cores all trl` |") in text


def test_the_fit_sentence_says_what_the_planner_table_says():
    """Per model, the reference first with whether it fits, then every other row under 'fit' or
    'do not fit' as its `fits` column says, each with its GB per GPU; an offload row with its
    host bytes and transfer time; whatever the table holds (nothing fits: 'none')."""
    import pandas as pd

    from logra.analysis.report import fit_sentences
    planner = pd.DataFrame({
        "model": ["m27b"] * 4, "method": ["dense_adam", "logra", "muon", "dense_adam+offload"],
        "gpus": 8, "gpu_bytes": 80e9, "total": [93.1e9, 45.5e9, 88.6e9, 35.6e9],
        "peak_phase": ["forward_backward", "kl_control", "propose", "forward_backward"],
        "fits": [False, True, False, True], "host": [None, None, None, 432e9],
        "pcie_seconds_per_step": [None, None, None, 25.9]})
    (sentence,) = fit_sentences(planner, "dense_adam")
    assert sentence == (
        "At m27b on 8 GPUs of 80 GB (predicted, per GPU): dense_adam 93.1 GB (forward_backward) "
        "does not fit; fit: logra 45.5 GB (kl_control), dense_adam+offload 35.6 GB "
        "(forward_backward, 432 GB on the host and 26 s of host-device transfer per update); do "
        "not fit: muon 88.6 GB (propose).")
    none = fit_sentences(planner.assign(fits=False), "dense_adam")[0]
    assert "; fit: none; do not fit: logra" in none


def test_the_accuracy_memory_table_sets_the_planners_prediction_beside_each_measurement():
    """Per task and method: accuracy with its t-interval, the measured peak and its ratio to the
    reference's, and the planner's GB per GPU at each of its models for that method (its own
    row, not its +offload one), labelled a prediction in the report."""
    from logra.analysis.report import _accuracy_memory_section
    from logra.analysis.tables import accuracy_memory_table
    accuracy = pd.DataFrame({"task": ["a", "a"], "method": ["d", "l"], "metric": "sampled",
                             "accuracy_mean": [0.4, 0.38], "accuracy_sd": [0.02, 0.01],
                             "n_seeds": [3, 3], "peak_mem_bytes_mean": [100.0, 40.0]})
    planner = pd.DataFrame({"model": ["big", "big", "big"], "method": ["d", "l", "l+offload"],
                            "total": [80e9, 30e9, 10e9]})
    t = accuracy_memory_table(accuracy, "d", planner).set_index("method")
    half = stats.t.ppf(0.975, 2) * 0.01 / 3 ** 0.5
    assert t.loc["l", ["accuracy_lo", "accuracy_hi"]].tolist() == pytest.approx(
        [0.38 - half, 0.38 + half])
    assert t.loc["l", "peak_vs_reference"] == pytest.approx(0.4)
    assert t["predicted big"].tolist() == [80e9, 30e9]
    text = "\n".join(_accuracy_memory_section(accuracy, "d", planner))
    assert "PREDICTION: GB per GPU, big" in text and "| a | l | 0.380 [0.355, 0.405] | 3 |" in text


def test_the_memory_real_section_sets_each_measured_phase_beside_its_prediction():
    """`snakemake memory_real`'s table (results/memory/real.csv, `memory_sweep_table` of its
    points) in the report: per method, each phase the planner predicts with its measured and
    planned GiB, their error and the measured peak phase, taken from the points."""
    import dataclasses

    from logra.analysis.report import ReportInputs, _memory_real
    from logra.analysis.tables import memory_sweep_table
    from logra.harness.config import grpo_settings
    from logra.harness.memory_point import measure
    grpo = dataclasses.asdict(grpo_settings({"temperature": 1.0, "aggregation": "dapo",
                                             "clip_low": 0.2, "clip_high": 0.28, "beta": 0.0,
                                             "probe_size": 2, "estimator": "grpo"}))
    size = {"architecture": "qwen2", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "tie_word_embeddings": True, "vocab_size": 512}
    shape = {"batch": 4, "micro_batch": 2, "prompt_len": 4, "completion_len": 4}
    points = {("real", m): measure(size, {"rule": m, "options": o}, shape, grpo, steps=3)
              | {"threads": 1} for m, o in (("dense_adam", {}), ("logra", {"rank": 4}))}
    table = memory_sweep_table(points, "dense_adam")
    summary = pd.DataFrame({"status": ["ok"]})
    inputs = ReportInputs(summary, pd.DataFrame(), [], [], pd.DataFrame(), memory_real=table)
    text = "\n".join(_memory_real(inputs))
    assert "`snakemake memory_real`: one update per method" in text
    for (_, method), p in points.items():
        for phase, measured in p["phase_peaks"].items():
            planned = p["planned"].get(f"phase_{phase}")
            if planned is None:  # a phase the method does not run (dense Adam's KL control)
                assert f"| {method} | {phase} |" not in text
                continue
            assert (f"| {method} | {phase} | {measured / 2**30:.3f} | {planned / 2**30:.3f} | "
                    f"{planned / measured - 1:+.1%} | "
                    f"{'yes' if phase == p['peak_phase'] else ''} |") in text
    assert _memory_real(dataclasses.replace(inputs, memory_real=None)) == []
    planned_only = dataclasses.replace(inputs, memory_real=None, planner=pd.DataFrame())
    assert "has not run (`snakemake memory_real`" in "\n".join(_memory_real(planned_only))


def test_an_opt_in_result_is_current_only_under_the_config_its_stamp_holds(tmp_path):
    """`current_opt_in`: a result whose stamp holds this config's digest and its own SHA-256 is
    read; one whose stamp holds another's, has none or a malformed one, or that was edited
    after its stamp, is stale, saying why; one never made is neither."""
    import json

    from logra.analysis.report import current_opt_in
    from logra.repro import file_digest
    for name, digest in (("a", "now"), ("b", "before"), ("c", None), ("e", "now"), ("f", "now")):
        (tmp_path / f"{name}.csv").write_text("x\n1\n")
        if digest:
            (tmp_path / f"{name}.stamp").write_text(json.dumps(
                {"config_digest": digest, "sha256": file_digest(tmp_path / f"{name}.csv")}))
    (tmp_path / "e.csv").write_text("x\n2\n")  # edited by hand after its stamp
    (tmp_path / "f.stamp").write_text('{"config_dig')  # a stamp cut short
    stamps = {str(tmp_path / f"{n}.csv"): str(tmp_path / f"{n}.stamp") for n in "abcdef"}
    current, stale = current_opt_in({"t": stamps}, "now")
    assert list(current) == [str(tmp_path / "a.csv")]
    assert [(s["result"], s["config_digest"], s["why"]) for s in stale] == [
        (str(tmp_path / "b.csv"), "before", "made under another config"),
        (str(tmp_path / "c.csv"), None, "no stamp"),
        (str(tmp_path / "e.csv"), "now", "changed after it was stamped"),
        (str(tmp_path / "f.csv"), None, f"malformed stamp {tmp_path / 'f.stamp'}")]


def _summary_of(tmp_path, runs):
    """A summary.csv as the workflow writes it from (task, method, seed, status, steps) runs,
    and the runs' summary.json paths."""
    from logra.analysis.tables import summary_table
    from logra.files import write_csv
    paths, evals = [], []
    for task, method, seed, status, steps in runs:
        paths.append(tmp_path / f"runs/{task}/{method}/seed{seed}/summary.json")
        evals.append(tmp_path / f"eval/{task}/{method}/seed{seed}.json")
        for path, record in ((paths[-1], {"task": task, "method": method, "seed": seed,
                                          "status": status, "steps": steps}),
                             (evals[-1], {"accuracy": 0.5, "primary": "sampled", "metrics": {}})):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, record)
    write_csv(summary_table(paths, evals, {}), tmp_path / "summary.csv")
    return tmp_path / "summary.csv", paths


RUNS = [("a", "dense_adam", 0, "ok", 3), ("a", "logra", 0, "ok", 3),
        ("a", "logra", 1, "diverged", 2)]


def test_a_summary_table_reads_back_only_whole_and_only_with_every_run_of_its_grid(tmp_path):
    """read_summary: the table as written reads back; a row cut off, a line cut mid-way, a
    run's status edited, or a run of another grid is a ValueError naming the file and the run
    or line, never a table with fewer runs."""
    from logra.analysis.tables import read_summary
    path, runs = _summary_of(tmp_path, RUNS)
    assert len(read_summary(path, runs)) == 3
    lines = path.read_text().splitlines(keepends=True)

    path.write_text("".join(lines[:-1]))  # cut short by one line
    with pytest.raises(ValueError, match=rf"{path}: no row for the run .*logra/seed1"):
        read_summary(path, runs)
    path.write_text("".join(lines[:-1]) + lines[-1][:12])  # cut mid-line
    with pytest.raises(ValueError, match=rf"{path}, line 4: \d+ fields where the header has"):
        read_summary(path, runs)
    path.write_text("".join(lines).replace("diverged", "ok"))
    with pytest.raises(ValueError, match=r"seed1/summary.json has status 'ok', the run 'diverged'"):
        read_summary(path, runs)
    path.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"rows of runs not in this grid: a/logra/1"):
        read_summary(path, runs[:2])
