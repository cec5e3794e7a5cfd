"""The workflow's fingerprints (results/fingerprints.csv) and the canary: the digests of
every stage's results (logra.repro) in one table, compared with a committed reference."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from logra.repro import eval_digest, file_digest, model_digest, tensors_digest


def canary() -> str:
    """Digest of a fixed computation through the kernels a run uses: three GRPO updates of a
    small random decoder on a fixed batch with random advantages, by dense Adam and by LoGRA
    with its controller (a forward-mode JVP). Two processes on one instruction path give one
    digest."""
    import torch
    from transformers import AutoModelForCausalLM

    from logra import rules
    from logra.harness.config import grpo_settings
    from logra.harness.memory_point import fixed_batch
    from logra.optim.kl_control import KLControl
    from logra.rl.models import tiny_config
    from logra.rl.step import update_step
    grpo = grpo_settings({"aggregation": "dapo", "temperature": 1.0, "clip_low": 0.2,
                          "clip_high": 0.28, "probe_size": 4, "micro_batch_size": 4,
                          "estimator": "grpo"})
    states = {}
    for rule, options, kl in [("dense_adam", {"lr": 1e-3}, {"target": 1e-3}),
                              ("logra", {"rank": 4, "update_ratio": 3e-3, "probe_responses": 2},
                               None)]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4))
        update = rules.build(rule, model, options)
        batch, probe = fixed_batch(model.config.vocab_size, 8, 6, 6, 4)
        for _ in range(3):
            update_step(model, None, update, KLControl(**kl) if kl else None, batch, probe, grpo)
        states |= {f"{rule}.{k}": v for k, v in model.state_dict().items()}
    return tensors_digest(states)


STAGES = ("data", "base", "train", "eval")  # in pipeline order
KINDS = (("data", "file"), ("base", "weights"), ("train", "weights"), ("train", "metrics"),
         ("eval", "result"))  # the (stage, what) of every row


def fingerprint_table(data: list, bases: list, runs: list, evals: list) -> pd.DataFrame:
    """results/fingerprints.csv: one row per (stage, name, what) with its SHA-256. `data`:
    split files; `bases`: SFT base model directories; `runs`: run summary.json files (their
    `fingerprint`); `evals`: evaluation JSONs. Names are the paths under results/."""
    def name(path, drop: str = "") -> str:
        parts = Path(path).parts
        return "/".join(parts[parts.index("results") + 1:] if "results" in parts else parts
                        ).removesuffix(drop)

    rows = [("data", name(p), "file", file_digest(p)) for p in data]
    rows += [("base", name(p), "weights", model_digest(p)) for p in bases]
    for p in runs:
        fp = json.loads(Path(p).read_text())["fingerprint"] or {}
        rows += [("train", name(p, "/summary.json"), what, fp.get(what))
                 for what in ("weights", "metrics")]
    rows += [("eval", name(p, ".json"), "result", eval_digest(json.loads(Path(p).read_text())))
             for p in evals]
    return pd.DataFrame(rows, columns=["stage", "name", "what", "sha256"])


def first_difference(fresh: pd.DataFrame, reference: pd.DataFrame) -> str | None:
    """None if `fresh` repeats `reference` row for row in every kind of row (KINDS) the
    reference holds, else the first stage (pipeline order) that differs, with its rows. A
    reference without a kind's rows (made before that kind changed on purpose, on a machine not
    at hand to remake it) checks the other kinds only: `unchecked` names them."""
    key = ["stage", "name", "what"]
    held = set(zip(reference["stage"], reference["what"]))
    fresh = fresh[[kind in held for kind in zip(fresh["stage"], fresh["what"])]]
    both = fresh.merge(reference, on=key, how="outer", suffixes=("", "_ref"), indicator=True)
    bad = both[(both["_merge"] != "both") | (both["sha256"] != both["sha256_ref"])]
    why = {"both": "other bits", "left_only": "not in the reference", "right_only": "missing"}
    for stage in STAGES:
        rows = bad[bad["stage"] == stage].to_dict("records")
        if rows:
            listed = "; ".join(f"{r['name']} {r['what']}: {why[r['_merge']]}" for r in rows)
            return f"stage {stage!r} differs first: {listed}"
    return None


def unchecked(reference: pd.DataFrame) -> list[str]:
    """The kinds of row (KINDS, as "stage what") a reference holds none of."""
    held = set(zip(reference["stage"], reference["what"]))
    return [f"{stage} {what}" for stage, what in KINDS if (stage, what) not in held]
