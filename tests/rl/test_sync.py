"""Sync transports: `delta` leaves the engine at cast(trainer weights) bit for bit, every
transport's bytes are its serialized payload's length, and the trainer-vs-engine log-prob
mismatch is what it says."""
import dataclasses
import math

import pytest
import torch

from logra.harness.config import grpo_settings
from logra.optim.dense_adam import DenseAdam
from logra.rl.loop import pad_batch
from logra.rl.loss import token_logprobs
from logra.rl.models import load
from logra.rl.rollout import HFRolloutEngine
from logra.rl.step import accumulate_gradients
from logra.rl.weight_sync import (
    EngineSync,
    apply_payload,
    delta_payload,
    deserialize,
    payload_bytes,
    serialize,
    serialized_bytes,
)

PROMPTS = ["Q: 1+2\nA: ", "Q: 33+4\nA: "]


def _step(model, tok, rule):
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    rule.apply(rule.propose(), 1.0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_delta_sync_leaves_the_engine_at_cast_trainer_weights_bit_for_bit(tiny_dir, dtype):
    """Dense Adam on the tiny model, synced by `delta` into the real engine process: after
    every step the engine's words equal cast(trainer weights) exactly. In bf16 at a small lr
    only some words change (the rest of each step rounds away), so the delta is a proper
    subset (6 bytes per changed word, against 2 per word in full: delta is the smaller below a
    third of the words); every transport's bytes are its payload's length as `serialize`
    writes it."""
    model, tok = load(tiny_dir)
    rule = DenseAdam(model, lr=1e-4)
    cast = getattr(torch, dtype)
    with HFRolloutEngine(str(tiny_dir), dtype=dtype) as engine:
        sync = EngineSync(rule, "delta", cast, has_engine=True)
        fractions = []
        for _ in range(3):
            before = {n: p.detach().to(cast, copy=True) for n, p in model.named_parameters()}
            _step(model, tok, rule)
            after = {n: p.detach().to(cast, copy=True) for n, p in model.named_parameters()}
            metrics = sync.step(engine)
            remote = engine.state_dict()
            for n, w in after.items():
                assert remote[n].dtype == cast and torch.equal(_bits(remote[n]), _bits(w)), n
            delta, changed = delta_payload(before, after)
            assert metrics["sync_bytes"] == metrics["sync_bytes_delta"] == serialized_bytes(delta)
            assert metrics["sync_bytes_full"] == serialized_bytes({"dense": after})
            assert metrics["sync_bytes_low_rank"] is None  # dense Adam has none
            total = sum(w.numel() for w in after.values())
            assert metrics["sync_changed_fraction"] == changed / total
            assert all(e["index"].dtype == torch.int32 for e in delta["delta"].values())
            fractions.append(changed / total)
            # an int32 index and a value per changed word
            assert payload_bytes(delta) == changed * (4 + after[n].element_size())
    if dtype == "bfloat16":
        assert all(0 < f < 0.9 for f in fractions), fractions


def test_delta_overwrite_is_exact_for_signed_zeros_and_any_word():
    """A word whose bits change but whose value compares equal (-0.0 vs 0.0) is sent too."""
    held = {"w": torch.tensor([0.0, 1.0, 2.0, -3.0], dtype=torch.bfloat16)}
    new = {"w": torch.tensor([-0.0, 1.0, 2.5, -3.0], dtype=torch.bfloat16)}
    payload, changed = delta_payload(held, new)
    assert changed == 2 and payload["delta"]["w"]["index"].tolist() == [0, 2]
    engine = {"w": held["w"].clone()}
    apply_payload(engine, deserialize(serialize(payload)), {})
    assert torch.equal(_bits(engine["w"]), _bits(new["w"]))


def test_serialized_length_is_the_payloads_not_its_addresses():
    """The byte count is the length of the bytes handed over, and the same payload at other
    memory addresses (a clone) or in a larger buffer has the same length: bytes are
    reproducible across runs and alike sharded or not."""
    gen = torch.Generator().manual_seed(0)
    payload = {"dense": {"a": torch.randn(64, 32, generator=gen)},
               "lowrank": {"b": {"side": "left", "basis": None,
                                 "coef": torch.randn(2, 32, generator=gen)}}}
    data = serialize(payload)
    assert serialized_bytes(payload) == len(data) > 4 * (64 * 32 + 2 * 32)
    clone = {"dense": {"a": payload["dense"]["a"].clone()},
             "lowrank": {"b": {**payload["lowrank"]["b"],
                               "coef": payload["lowrank"]["b"]["coef"].clone()}}}
    assert serialized_bytes(clone) == len(data)
    # a tensor viewing into a larger buffer (FSDP's gathered rows) is sent as itself
    bigger = torch.zeros(80, 32)
    bigger[:64] = payload["dense"]["a"]
    assert serialized_bytes({**payload, "dense": {"a": bigger[:64]}}) == len(data)
    back = deserialize(data)
    assert torch.equal(back["dense"]["a"], payload["dense"]["a"])
    assert back["lowrank"]["b"]["basis"] is None and back["lowrank"]["b"]["side"] == "left"


G = grpo_settings({"micro_batch_size": 6, "aggregation": "dapo", "temperature": 0.7,
                  "clip_low": 0.2, "clip_high": 0.28, "beta": 0.0, "estimator": "grpo"})


def test_logp_mismatch_is_zero_for_equal_logprobs_and_matches_a_constructed_difference(
        tiny_dir):
    """Trainer log-probs against engine log-probs equal to them: mismatch exactly 0; against
    them plus a constructed difference d on the completion tokens: mean |d| and max |d|. The
    token entropy is −mean log π over the completion tokens, whatever the engine's log-probs."""
    model, tok = load(tiny_dir)
    with HFRolloutEngine(str(tiny_dir)) as engine:
        rollouts = engine.generate(PROMPTS, 3, 6, G.temperature, seed=0)
    ids, attn, mask, _ = pad_batch(rollouts, tok.pad_token_id)
    # a row of the loss mask counts its completion's tokens (the loop's response_tokens_mean)
    assert mask.sum(dim=1).tolist() == [len(r.completion_ids) for r in rollouts]
    adv = torch.linspace(-1, 1, len(rollouts))
    with torch.no_grad():
        own = token_logprobs(model, ids, attn, G.temperature).float()
    done = torch.arange(len(rollouts)) % 2 == 0  # as if these responses had ended with eos
    _, same = accumulate_gradients(model, None, ids, attn, mask, adv, G, engine_logp=own,
                                   completed=done)
    entropy = same.pop("token_entropy")
    assert same == {"logp_mismatch_mean": 0.0, "logp_mismatch_max": 0.0,
                    "logp_mismatch_signed": 0.0}
    assert entropy == pytest.approx(-own.double()[mask.bool()].mean().item(), rel=1e-12)
    assert entropy > 0
    d = torch.randn(own.shape, generator=torch.Generator().manual_seed(1)) * mask
    _, got = accumulate_gradients(model, None, ids, attn, mask, adv, G, engine_logp=own + d,
                                  completed=done)
    gap = ((own + d).double() - own.double())[mask.bool()]
    assert got["logp_mismatch_mean"] == pytest.approx(gap.abs().mean().item(), rel=1e-12)
    assert got["logp_mismatch_max"] == pytest.approx(gap.abs().max().item(), rel=1e-12)
    # signed engine − trainer, over the tokens of the responses that ended with eos only
    signed = ((own + d).double() - own.double())[mask.bool() & done[:, None]]
    assert got["logp_mismatch_signed"] == pytest.approx(signed.mean().item(), rel=1e-12)
    _, none = accumulate_gradients(model, None, ids, attn, mask, adv, G, engine_logp=own + d,
                                   completed=torch.zeros_like(done))
    assert math.isnan(none["logp_mismatch_signed"])
    assert got["token_entropy"] == none["token_entropy"] == entropy


def test_reinforce_on_a_bf16_engine_weighs_each_token_by_its_truncated_ratio(tiny_dir):
    """The authors' REINFORCE (grpo.estimator reinforce_baseline) on a bf16 engine's rollouts:
    accumulate_gradients's gradients are those of −Σ w·A·log π / T with w = min(π/π_engine, 2)
    from the engine's own log-probs, whose bf16 rounding moves w off 1 (an fp32 engine's w is 1
    up to kernel order: the test above bounds its gap by 1e-4)."""
    model, tok = load(tiny_dir)
    with HFRolloutEngine(str(tiny_dir), dtype="bfloat16") as engine:
        rollouts = engine.generate(PROMPTS, 3, 6, G.temperature, seed=0)
    ids, attn, mask, engine_logp = pad_batch(rollouts, tok.pad_token_id)
    adv = torch.linspace(-1, 1, len(rollouts))
    g = dataclasses.replace(G, estimator="reinforce_baseline", importance_cap=2.0)
    accumulate_gradients(model, None, ids, attn, mask, adv, g, engine_logp=engine_logp)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logp = token_logprobs(model, ids, attn, G.temperature)
    w = torch.exp(logp.detach() - engine_logp).clamp(max=2.0)
    (-(w * adv[:, None] * logp * mask).sum() / mask.sum()).backward()
    assert all(torch.allclose(got[n], p.grad, rtol=1e-4, atol=1e-7)
               for n, p in model.named_parameters())
    assert (w[mask.bool()] - 1).abs().max() > 1e-3  # bf16's rounding: not the fp32 engine's 1


@pytest.mark.parametrize("dtype, bound", [("float32", 1e-4), ("bfloat16", 0.5)])
def test_engine_logprobs_follow_the_trainers_temperature_convention(tiny_dir, dtype, bound):
    """With the trainer's weights, the engine's log-probs of its sampled tokens are the
    trainer's `token_logprobs` at the sampling temperature (fp32: up to kernel order; bf16:
    up to its rounding), not the untempered ones."""
    model, tok = load(tiny_dir)
    with HFRolloutEngine(str(tiny_dir), dtype=dtype) as engine:
        rollouts = engine.generate(PROMPTS, 3, 6, G.temperature, seed=0)
    assert all(len(r.logprobs) == len(r.completion_ids) for r in rollouts)
    ids, attn, mask, engine_logp = pad_batch(rollouts, tok.pad_token_id)
    m = mask.bool()
    with torch.no_grad():
        tempered = token_logprobs(model, ids, attn, G.temperature)[m]
        untempered = token_logprobs(model, ids, attn, 1.0)[m]
    gap = (tempered - engine_logp[m]).abs().max().item()
    assert gap < bound, gap
    assert (untempered - engine_logp[m]).abs().max().item() > 10 * gap
