"""The update's spectrum (logra/measure/spectrum.py), as stated invariants: a rank-k update
has stable rank ≤ k and all its energy in its top k; a flat spectrum spreads evenly; a saved
model against its base is measured matrix by matrix, the unchanged ones as NaN."""
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from logra.measure.spectrum import matrix_spectrum, update_spectrum
from logra.optim.logra_rule import TARGET_MODULES
from logra.rl.models import build_tiny


def test_a_rank_k_update_keeps_its_energy_in_its_top_k():
    g = torch.Generator().manual_seed(0)
    low = torch.randn(32, 2, generator=g) @ torch.randn(2, 48, generator=g)
    s = matrix_spectrum(low, rank=2)
    assert 1 <= s["stable_rank"] <= 2 and s["rank_90"] <= 2
    assert s["energy_top_r"] == pytest.approx(1.0)
    assert s["fro"] == pytest.approx(float(low.norm()))
    one = matrix_spectrum(torch.outer(torch.arange(1.0, 5.0), torch.ones(3)), rank=1)
    assert one["stable_rank"] == pytest.approx(1.0) and one["rank_90"] == 1


def test_a_flat_spectrum_spreads_over_every_direction():
    s = matrix_spectrum(torch.eye(20), rank=4)
    assert s["stable_rank"] == pytest.approx(20.0)
    assert s["energy_top_r"] == pytest.approx(4 / 20)
    assert s["rank_90"] == 18  # 18 of 20 equal directions hold 90%
    assert math.isnan(matrix_spectrum(torch.zeros(3, 5), rank=2)["stable_rank"])


def test_a_saved_model_is_measured_against_its_base_matrix_by_matrix(tmp_path):
    """A tiny model, then a copy whose one q_proj moved by a rank-1 update and one up_proj by a
    dense one: every target matrix has a row, the q_proj's at stable rank 1, the up_proj's
    spread, the rest unchanged (NaN)."""
    base = build_tiny(tmp_path / "base", hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2)
    weights = load_file(base / "model.safetensors")
    q = next(n for n in weights if n.endswith("q_proj.weight"))
    up = next(n for n in weights if n.endswith("up_proj.weight"))
    g = torch.Generator().manual_seed(1)
    weights[q] = weights[q] + 0.1 * torch.outer(torch.randn(weights[q].shape[0], generator=g),
                                                torch.randn(weights[q].shape[1], generator=g))
    weights[up] = weights[up] + 0.1 * torch.randn(weights[up].shape, generator=g)
    final = tmp_path / "final"
    final.mkdir()
    save_file({n: w.contiguous() for n, w in weights.items()}, final / "model.safetensors")
    rows = {r["matrix"]: r for r in update_spectrum(base, final, list(TARGET_MODULES), rank=4)}
    assert len(rows) == len(TARGET_MODULES)  # one layer: each target module once
    assert rows[q]["stable_rank"] == pytest.approx(1.0) and rows[q]["energy_top_r"] == \
        pytest.approx(1.0)
    assert rows[up]["stable_rank"] > 8 and rows[up]["energy_top_r"] < 0.5
    assert (rows[up]["rows"], rows[up]["cols"]) == (64, 32)
    assert all(math.isnan(r["stable_rank"]) for n, r in rows.items() if n not in (q, up))
    with pytest.raises(ValueError, match="no 2-D weight of the target modules"):
        update_spectrum(base, final, ["nothing"], rank=4)
