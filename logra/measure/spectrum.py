"""The update's spectrum: how low-rank is what RL training did to each weight matrix?

For each target matrix W (2-D, its name's module among `target_modules`: the Linear layers
LoGRA updates) the update is Δ = W_final − W_base, and with σ_1 ≥ σ_2 ≥ … its singular values
(float64 SVD):
- `stable_rank` = Σσ_i² / σ_1², the rank Δ's energy spreads over (1: a rank-1 update; the
  smaller dimension: a flat spectrum);
- `energy_top_r` = Σ_{i≤r} σ_i² / Σσ_i², the share of the update a rank-r sketch can hold
  (r: LoGRA's rank);
- `rank_90`: the fewest singular values that hold 90% of the energy.
A matrix the run did not change (Δ = 0) has NaN for each. Weights are read from the
safetensors files of each model folder (a saved run, and its SFT base or hub model).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch


def _weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model folder's safetensors files; a hub id (no such folder) is read
    from the hub's cache, as transformers would load it."""
    from safetensors.torch import load_file
    if not Path(model_dir).is_dir():
        from huggingface_hub import snapshot_download
        model_dir = snapshot_download(str(model_dir), allow_patterns=["*.safetensors"])
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors file (a saved model folder)")
    out = {}
    for f in files:
        out |= load_file(f)
    return out


def matrix_spectrum(delta: torch.Tensor, rank: int) -> dict[str, float]:
    """`stable_rank`, `energy_top_r` (r = `rank`), `rank_90` and the Frobenius norm `fro` of
    one update (the module docstring)."""
    energy = torch.linalg.svdvals(delta.to(torch.float64)) ** 2
    total = float(energy.sum())
    if total == 0:
        return {"fro": 0.0, "stable_rank": math.nan, "energy_top_r": math.nan,
                "rank_90": math.nan}
    share = torch.cumsum(energy, 0) / total
    return {"fro": math.sqrt(total), "stable_rank": total / float(energy[0]),
            "energy_top_r": float(share[min(rank, len(share)) - 1]),
            "rank_90": int(torch.searchsorted(share, torch.tensor(0.9, dtype=share.dtype))) + 1}


def update_spectrum(base_dir: str | Path, model_dir: str | Path, target_modules: list[str],
                    rank: int) -> list[dict]:
    """One row per target matrix of the model in `model_dir` against its base in `base_dir`:
    its name, shape, `rank` and `matrix_spectrum`. A target matrix missing from the base, or
    of another shape there, is an error that names it."""
    base, final = _weights(base_dir), _weights(model_dir)
    pattern = re.compile(r"(^|\.)(" + "|".join(map(re.escape, target_modules)) + r")\.weight$")
    rows = []
    for name in sorted(n for n in final if pattern.search(n) and final[n].dim() == 2):
        if name not in base or base[name].shape != final[name].shape:
            raise ValueError(f"{model_dir}: {name} {tuple(final[name].shape)} has no match in "
                             f"the base {base_dir}")
        rows.append({"matrix": name, "rows": final[name].shape[0], "cols": final[name].shape[1],
                     "rank": rank, **matrix_spectrum(final[name].float() - base[name].float(),
                                                     rank)})
    if not rows:
        raise ValueError(f"{model_dir}: no 2-D weight of the target modules {target_modules}")
    return rows
