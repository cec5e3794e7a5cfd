"""The `galore` baseline is the official galore-torch optimizer, with its memory as it is."""
import pytest
import torch
from galore_torch import GaLoreAdamW
from galore_torch.galore_projector import GaLoreProjector

from logra import rules
from logra.rl.models import load


def _step(model, tok, rule):
    ids = tok(["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"], return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    rule.apply(rule.propose(), 1.0)


def test_official_optimizer_runs_and_state_bytes_match_galore(tiny_dir):
    model, tok = load(tiny_dir)
    r = 4
    rule = rules.build("galore", model, {"rank": r, "update_proj_gap": 2, "lr": 1e-3})
    assert type(rule.optimizer) is GaLoreAdamW
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(3):  # crosses a projection refresh
        _step(model, tok, rule)
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    projected = [p for p, s in rule.optimizer.state.items() if "projector" in s]
    assert projected and all(isinstance(rule.optimizer.state[p]["projector"], GaLoreProjector)
                             for p in projected)
    assert len(projected) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    # GaLore's formula: moments of the projected gradient (2 r max(m, n)) and the projection.
    # galore-torch keeps the projection as a slice of the full SVD factor, so the bytes alive
    # for it are min(m, n)^2 floats, not r min(m, n): measured from the storages, as they are.
    expected = 0
    for p, s in rule.optimizer.state.items():
        if "projector" in s:
            m, n = p.shape
            expected += 4 * (2 * r * max(m, n) + min(m, n) ** 2)
        else:
            expected += 4 * 2 * p.numel()
    assert rule.state_bytes() == expected
    assert rule.peak_grad_bytes() == sum(p.numel() * 4 for p in model.parameters())
    assert rule.sync_payload()["dense"].keys() == dict(model.named_parameters()).keys()


def test_galore_step_cannot_be_scaled(tiny_dir):
    model, tok = load(tiny_dir)
    rule = rules.build("galore", model, {"rank": 4})
    with pytest.raises(ValueError, match="cannot be scaled"):
        rule.apply(None, 0.5)
    with pytest.raises(NotImplementedError, match="predicted-KL control"):
        rule.perturbed(None, 1.0)


def test_every_rule_uses_one_adam_eps(tiny_dir):
    """GaLore, Sketch-Adam and dense Adam default to the same ε (galore-torch's own is 1e-6;
    LoGRA's RowAdam has a relative ε of its own, the authors')."""
    import inspect

    from baselines.galore import GaLore
    from baselines.sketch_adam import SketchAdam
    from logra.optim.dense_adam import DenseAdam

    defaults = {cls.__name__: inspect.signature(cls).parameters["eps"].default
                for cls in (GaLore, SketchAdam, DenseAdam)}
    assert set(defaults.values()) == {1e-8}, defaults
    rule = rules.build("galore", load(tiny_dir)[0], {"rank": 4})
    assert {g["eps"] for g in rule.optimizer.param_groups} == {1e-8}
