"""The `lora` baseline is peft's LoRA, its sync ships adapter factors or merged weights, and it
unwraps cleanly."""
import pytest
import torch
from peft.tuners.lora import LoraLayer

from logra import rules
from logra.rl.models import load
from logra.rl.rollout import HFRolloutEngine
from logra.rl.weight_sync import payload_bytes, serialized_bytes

PROMPTS = ["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"]


def _step(model, tok, rule):
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    loss = model(**ids, labels=ids["input_ids"]).loss
    loss.backward()
    rule.apply(rule.propose(), 1.0)
    return loss.item()


def test_peft_adapters_train_and_state_bytes_match_lora(tiny_dir):
    model, tok = load(tiny_dir)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = 4
    rule = rules.build("lora", model, {"rank": r, "lr": 1e-2})
    adapted = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert len(adapted) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    losses = [_step(model, tok, rule) for _ in range(5)]
    assert losses[-1] < losses[0]  # the adapters learn
    # LoRA's formula: A (r x n) and B (m x r) per adapted weight; Adam keeps two moments of each
    adapter_bytes = sum(4 * r * (m.in_features + m.out_features) for m in adapted)
    assert rule.state_bytes() == 2 * adapter_bytes
    assert rule.peak_grad_bytes() == adapter_bytes
    for n, p in model.named_parameters():  # the base weights never move
        if not p.requires_grad:
            assert torch.equal(p, frozen[n.replace(".base_layer", "")]), n


@pytest.mark.parametrize("sync", ["low_rank", "full"])
def test_engine_equals_the_merged_weights_and_unwrap_leaves_the_plain_model(tiny_dir, sync):
    """The rollout engine (its own process) receives each step's payload: adapter factors,
    r·(m + n) values per module (`low_rank`), or every adapted weight merged (`full`); after
    each sync its weights equal the trainer's merged weights."""
    model, tok = load(tiny_dir)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    r = 4
    rule = rules.build("lora", model, {"rank": r, "lr": 1e-2})
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    with HFRolloutEngine(str(tiny_dir)) as engine:
        for _ in range(3):
            _step(model, tok, rule)
            payload = (rule.sync_payload() if sync == "low_rank"
                       else {"dense": rule.engine_weights()})
            sent = engine.sync(payload)
            merged = rule.engine_weights()
            remote = engine.state_dict()
            for n, w in merged.items():
                assert torch.equal(remote[n], w), n
    shapes = [tuple(w.shape) for w in merged.values()]
    expected = (sum(4 * r * (m + n) for m, n in shapes) if sync == "low_rank"
                else sum(4 * m * n for m, n in shapes))
    assert sent == serialized_bytes(payload) and payload_bytes(payload) == expected
    assert set(merged) < set(base)  # adapted weights only, under the base model's names
    for n, w in merged.items():
        assert not torch.equal(w, base[n]), n
    with torch.no_grad():
        logits = model(**ids).logits
    rule.unwrap()
    assert not any(isinstance(m, LoraLayer) for m in model.modules())
    state = model.state_dict()
    assert state.keys() == base.keys()
    for n, w in merged.items():
        assert torch.equal(state[n], w), n
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, logits, rtol=1e-5, atol=1e-5)


def test_rank_that_does_not_fit_names_the_module(tiny_dir):
    model, _ = load(tiny_dir)
    with pytest.raises(ValueError, match=r"rank=65 exceeds min\(shape\)=64 of "
                                         r"model\.layers\.0\.self_attn\.q_proj\.weight"):
        rules.build("lora", model, {"rank": 65})
