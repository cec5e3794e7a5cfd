"""The rollout engine runs in its own process and matches the trainer only through payloads."""
import torch

from baselines.dense_adam import DenseAdam
from logra.modeling import load
from logra.rollout import HFRolloutEngine
from logra.sync import apply_payload, payload_bytes


def test_sync_payload_reproduces_trainer_weights_in_engine_process(tiny_dir):
    model, tok = load(tiny_dir)
    rule = DenseAdam(model, lr=1e-2)
    with HFRolloutEngine(str(tiny_dir)) as engine:
        prompts = ["Q: 1+2\nA: ", "Q: 33+4\nA: "]
        before = engine.generate(prompts, 3, 6, 1.0, seed=0)
        assert len(before) == 6 and all(r.prompt_ids == tok(prompts[i // 3])["input_ids"]
                                        for i, r in enumerate(before))
        for _ in range(2):  # two real updates
            ids = tok(prompts, return_tensors="pt", padding=True)
            model(**ids, labels=ids["input_ids"]).loss.backward()
            rule.apply(rule.propose(), 1.0)
            payload = rule.sync_payload()
            sent = engine.sync(payload)
        assert sent == sum(p.numel() * 4 for p in model.parameters()) == payload_bytes(payload)
        remote = engine.state_dict()
        for name, p in model.named_parameters():
            assert torch.equal(remote[name], p.detach()), name
        # the engine's sampling now follows the updated weights: same seed, different draws
        after = engine.generate(prompts, 3, 6, 1.0, seed=0)
        assert [r.completion_ids for r in after] != [r.completion_ids for r in before]


def test_engine_reports_errors_instead_of_hanging(tiny_dir):
    with HFRolloutEngine(str(tiny_dir)) as engine:
        try:
            engine.sync({"dense": {"no.such.weight": torch.zeros(1)}})
        except RuntimeError as e:
            assert "no.such.weight" in str(e)
        else:
            raise AssertionError("bad payload was accepted")


def test_lowrank_payload_applies_lift_on_the_right_side():
    w = {"a": torch.zeros(6, 4), "b": torch.zeros(6, 4)}
    q_left, c_left = torch.randn(6, 2), torch.randn(2, 4)
    q_right, c_right = torch.randn(4, 2), torch.randn(6, 2)
    bases = {}
    payload = {"lowrank": {"a": {"side": "left", "basis": q_left, "coef": c_left},
                           "b": {"side": "right", "basis": q_right, "coef": c_right}}}
    apply_payload(w, payload, bases)
    assert torch.allclose(w["a"], q_left @ c_left) and torch.allclose(w["b"], c_right @ q_right.T)
    assert payload_bytes(payload) == 4 * (12 + 8 + 8 + 12)
    apply_payload(w, {"lowrank": {"a": {"side": "left", "basis": None, "coef": c_left}}}, bases)
    assert torch.allclose(w["a"], 2 * q_left @ c_left)  # cached basis reused
