"""The report's memory sections: the planner's predictions and which fit, the planner against a
real architecture's measured phases (`snakemake memory_real`) and the published memory
reductions predicted in their settings, one update at the cap and as the authors measure them."""
from __future__ import annotations

import pandas as pd

from logra.analysis.markdown import ReportInputs, _fmt, _section
from logra.analysis.tables import paper_setting_curve, paper_setting_table
from logra.common import PHASES


def _planner(inputs: ReportInputs) -> list[str]:
    planner = inputs.planner
    if planner is None:
        return []
    offload = {c: planner[c] if c in planner else [None] * len(planner)
               for c in ("host", "pcie_bytes_per_step", "pcie_seconds_per_step")}
    return _section("Planner predictions", "results/memory/planner.csv", "Predicted, not "
                    "measured: bytes per GPU by the planner (logra/measure/planner.py); "
                    "`+offload`: FSDP's CPU offload, the node's host bytes and each GPU's "
                    "host-device traffic per update.",
                    {"model": planner["model"], "method": planner["method"],
                     "GPUs": planner["gpus"], "policy": planner["policy"],
                     "GB per GPU": _fmt(planner["total"], ".1f", 1e9),
                     "peak phase": planner["peak_phase"],
                     "GPU GB": _fmt(planner["gpu_bytes"], ".0f", 1e9),
                     "fits": planner["fits"],
                     "sync GB": _fmt(planner["sync_bytes"], ".3g", 1e9),
                     "host GB": _fmt(offload["host"], ".0f", 1e9),
                     "PCIe GB / update": _fmt(offload["pcie_bytes_per_step"], ".0f", 1e9),
                     "PCIe s / update": _fmt(offload["pcie_seconds_per_step"], ".1f")}
                    ) + [x for sentence in fit_sentences(planner, inputs.reference)
                         for x in ("", sentence)]


def _memory_real(inputs: ReportInputs) -> list[str]:
    t = inputs.memory_real
    if t is None:
        return (["", "The planner's check at a real architecture's shapes has not run "
                 "(`snakemake memory_real` writes `results/memory/real.csv`; the next report "
                 "includes it)."] if inputs.planner is not None else [])
    rows = [(r, phase) for _, r in t.iterrows() for phase in PHASES
            if pd.notna(r.get(f"planned_phase_{phase}")) and pd.notna(r.get(f"phase_{phase}"))]
    measured = pd.Series([r[f"phase_{p}"] for r, p in rows], dtype=float)
    planned = pd.Series([r[f"planned_phase_{p}"] for r, p in rows], dtype=float)
    return _section(
        "The planner at a real architecture's shapes", "results/memory/real.csv",
        f"`snakemake memory_real`: one update per method at {int(t['n_params'].iloc[0]):,} "
        f"parameters ({int(t['vocab_size'].iloc[0]):,}-token vocabulary, random weights), "
        f"{int(t['batch'].iloc[0])} sequences of {int(t['seq_len'].iloc[0])} tokens in "
        f"micro-batches of {int(t['micro_batch'].iloc[0])}, measured on {t['device'].iloc[0]} "
        "(live tensor bytes, logra.measure.memory.MemoryMeter) phase by phase, beside the "
        "planner's prediction of each phase, which no term fits to the measurement.",
        {"method": [r["method"] for r, _ in rows], "phase": [p for _, p in rows],
         "measured GiB": _fmt(measured, ".3f", 2**30), "planned GiB": _fmt(planned, ".3f", 2**30),
         "error": _fmt(planned / measured - 1, "+.1%"),
         "peak": ["yes" if p == r["peak_phase"] else "" for r, p in rows]})


def fit_sentences(planner: pd.DataFrame, reference: str) -> list[str]:
    """Per model of the planner's table, which methods its prediction fits on the GPU and
    which not, the reference first, each with its GB per GPU and peak phase, the offload
    rows with their host bytes and transfer time: written from the table, whatever it says."""
    out = []
    for model, rows in planner.groupby("model", sort=False):
        def said(r) -> str:
            extra = (f", {r['host'] / 1e9:.0f} GB on the host and {r['pcie_seconds_per_step']:.0f}"
                     " s of host-device transfer per update"
                     if "host" in r and pd.notna(r["host"]) else "")
            return f"{r['method']} {r['total'] / 1e9:.1f} GB ({r['peak_phase']}{extra})"
        first = rows.iloc[0]
        ref = rows[rows["method"] == reference]
        lead = (f"{said(ref.iloc[0])} {'fits' if ref.iloc[0]['fits'] else 'does not fit'}; "
                if len(ref) else "")
        rest = rows[rows["method"] != reference]
        fit, no = rest[rest["fits"] == True], rest[rest["fits"] != True]  # noqa: E712
        out.append(f"At {model} on {first['gpus']} GPUs of {first['gpu_bytes'] / 1e9:.0f} GB "
                   f"(predicted, per GPU): {lead}fit: "
                   f"{', '.join(said(r) for _, r in fit.iterrows()) or 'none'}; do not fit: "
                   f"{', '.join(said(r) for _, r in no.iterrows()) or 'none'}.")
    return out


def _paper_setting(inputs: ReportInputs) -> list[str]:
    if inputs.paper_setting is None:
        return []
    t = paper_setting_table(inputs.paper_setting)
    return _section(
        "The published memory reductions, predicted in their settings",
        "results/memory/paper_setting.csv",
        "Predicted, not measured (logra/measure/planner.py): one update's peak per training GPU "
        "at the setting's longest sequences, the methods at the authors' defaults, beside the "
        "published numbers. Where they differ, and why: (1) the published statistic "
        "(`memory/train_peak_allocated_gib`) is a mean over updates of each update's peak, at "
        "that update's own longest sequence, so the prediction bounds it from above for both "
        "methods, and the reduction moves with the sequence lengths the runs drew (the next "
        "table predicts it over those lengths); "
        "(2) logits 'chunked' is this project's training forward (log-probs 256 tokens at a "
        "time), 'full' the authors' (fp32 logits and a full log_softmax at every position): "
        "vocabulary-sized tensors added to both methods shrink or move the reduction; LoGRA's "
        "JVP probe is predicted as the authors' code runs it (paper_setting.probe: one "
        "sequence at a time over all its positions, eager attention's scores, fp32 logits and "
        "tangent, the float64 KL 64 positions at a time); (3) the port (port_7b) runs without "
        "the controller and trains the weights LoGRA leaves out (embeddings, output layer, "
        "norms) with AdamW, predicted so (their gradients and moments counted); elsewhere they are frozen as the authors "
        "freeze them, and 'frozen weights' AdamW' is what training them would add per GPU; "
        "under FSDP every method holds the root group (embeddings, output layer) gathered "
        "through forward and backward. 'without peak "
        "phase': the reduction were the method's peak phase left out (for LoGRA at a long "
        "completion, its predicted-KL probe). None of these numbers is a measurement: "
        "benchmarks/gpu_check.py measures the authors' statistic at 0.5B and 1.5B on one GPU.",
        {"setting": t["setting"], "logits": t["logits"], "tokens": t["seq_len"],
         "GPUs": t["gpus"],
         "reference": t["reference"], "GiB": _fmt(t["reference_gib"], ".2f"),
         "method": t["method"], "method GiB": _fmt(t["method_gib"], ".2f"),
         "reduction": _fmt(t["reduction"], ".1%"), "method's peak phase": t["peak_phase"],
         "without peak phase": _fmt(t["reduction_without_peak_phase"], ".1%"),
         "frozen weights' AdamW, GiB": _fmt(t["frozen_adamw_gib"], ".2f"),
         "published GiB": [f"{a} -> {b}" if pd.notna(a) else "n/a"
                           for a, b in zip(t["published_reference_gib"],
                                           t["published_method_gib"])],
         "published reduction": _fmt(t["published_reduction"], ".1%"),
         "source": t["source"]}) + _paper_setting_curve(inputs.paper_setting)


def _paper_setting_curve(predicted: pd.DataFrame) -> list[str]:
    if "statistic" not in predicted:
        return []
    c = paper_setting_curve(predicted)
    keys = ["setting", "logits", "method"]
    wide = c.pivot_table(index=keys, columns="longest_len", values="reduction", sort=False)
    first = c.groupby(keys, sort=False)[["published_reduction", "published_at"]].first()
    return _section(
        "The published memory reductions as the authors measure them",
        "results/memory/paper_setting.csv",
        "Predicted, not measured: the authors' statistic, the mean over updates of each "
        "update's peak, with every update's longest sequence (prompt included; the probe's "
        "sequences as long) at each length, the last the setting's cap (the table above). "
        "Each update's peak is set by its own longest micro-batch, so the runs' typical "
        "longest length, not in the sources, decides the published number; `meets it at`: the "
        "length at which the predicted reduction equals the published one (n/a: not within "
        "these lengths). No term is fitted to the published numbers.",
        {"setting": [k[0] for k in wide.index], "logits": [k[1] for k in wide.index],
         "method": [k[2] for k in wide.index],
         **{f"{int(n)} tokens": _fmt(wide[n], ".1%") for n in wide.columns},
         "published": _fmt(first["published_reduction"], ".1%"),
         "meets it at": _fmt(first["published_at"], ".0f")})
