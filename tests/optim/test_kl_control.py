"""Invariants of the KL probe (logra/optim/kl_control.py):

1. The KL formed in chunks of tokens equals the full-vocabulary KL, for any chunk size, tied or
   untied output layer, any temperature.
2. Its memory grows with the chunk, not with the probe: the probe phase's measured peak barely
   moves when the probe has 4x the sequences, and grows by at most three chunk-sized
   vocabulary tensors with the chunk.
3. The probe splits into a prediction half and a held-out half, and a calibration summary
   reports realized / predicted separately at η = 1 and η < 1.
"""
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from logra.harness.memory_point import fixed_batch
from logra.measure.memory import MemoryMeter
from logra.optim.kl_control import calibration, probe_base, probe_kl, split_probe
from logra.rl.models import tiny_config


def _model(seed=0, **options):
    torch.manual_seed(seed)
    config = tiny_config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, **options)
    return AutoModelForCausalLM.from_config(config)


def _full_kl(base_logits, new_logits, mask, temperature):
    p = torch.log_softmax(base_logits[:, :-1].double() / temperature, -1)
    q = torch.log_softmax(new_logits[:, :-1].double() / temperature, -1)
    per_token = (p.exp() * (p - q)).sum(-1)
    return ((per_token * mask).sum() / mask.sum()).item()


def _logits(model, ids, attn):
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, position_ids=pos).logits


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_kl_equals_the_full_vocabulary_kl(tied, temperature):
    model = _model(tie_word_embeddings=tied)
    _, probe = fixed_batch(model.config.vocab_size, 4, 5, 7, 4)
    ids, attn, mask = probe
    attn = attn.clone()
    attn[0, :2] = 0  # a left-padded row
    mask = mask.clone()
    mask[1, -2:] = 0  # a shorter completion
    probe = (ids, attn, mask)
    before = _logits(model, ids, attn)
    for chunk in (1, 5, 10_000):
        base = probe_base(model, probe, temperature, chunk)
        with torch.no_grad():
            for p in model.parameters():  # the update: every weight moves, the head too
                p.add_(torch.randn_like(p) * 0.02)
        expected = _full_kl(before, _logits(model, ids, attn), mask, temperature)
        got = probe_kl(model, base, probe)
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-7), f"chunk={chunk}"
        assert probe_kl(model, probe_base(model, probe, temperature, chunk), probe) == \
            pytest.approx(0.0, abs=1e-6)
        before = _logits(model, ids, attn)


def _probe_phase_peak(vocab, sequences, chunk):
    model = _model(vocab_size=vocab)
    _, probe = fixed_batch(vocab, sequences, 8, 32, sequences)
    with MemoryMeter("cpu") as meter:
        base = probe_base(model, probe, 1.0, chunk)
        with torch.no_grad():
            model.lm_head.weight.mul_(1.01)
        probe_kl(model, base, probe)
    return meter.report.net_peak_bytes


def test_probe_memory_grows_with_the_chunk_not_with_the_probe():
    vocab = 8192
    row = vocab * 4  # one token's float32 log-probs
    small, large = _probe_phase_peak(vocab, 2, 16), _probe_phase_peak(vocab, 8, 16)
    wider = _probe_phase_peak(vocab, 8, 64)
    whole = 6 * 40 * row  # one (sequences, positions, vocabulary) tensor for the extra 6 sequences
    assert large - small < 0.1 * whole, (small, large, whole)
    # three chunk-sized float32 tensors at most (48 tokens more per chunk)
    assert 2 * 48 * row <= wider - large <= 3.2 * 48 * row, (large, wider)


def test_split_probe_and_calibration():
    _, probe = fixed_batch(50, 6, 3, 4, 6)
    fit, held_out = split_probe(probe)
    assert fit[0].shape[0] == held_out[0].shape[0] == 3
    assert torch.equal(torch.cat([fit[0], held_out[0]]), probe[0])
    with pytest.raises(ValueError, match="grpo.probe_size"):
        split_probe(tuple(t[:1] for t in probe))
    rows = [{"kl_pred": p, "kl_real": r, "step_scale": e} for p, r, e in [
        (1.0, 2.0, 1.0), (1.0, 1.0, 1.0), (1.0, 0.5, 0.3), (2.0, 1.0, 0.5), (1.0, 3.0, 0.2),
        (math.nan, 1.0, 1.0), (0.0, 1.0, 0.4)]]
    cal = calibration(rows)
    assert cal["eta_1"]["steps"] == 2 and cal["eta_1"]["median"] == 1.5
    assert cal["eta_below_1"]["steps"] == 3 and cal["eta_below_1"]["median"] == 0.5
    assert cal["eta_below_1"]["p10"] <= 0.5 <= cal["eta_below_1"]["p90"] <= 3.0


def test_the_bases_of_the_halves_are_the_halves_bases():
    model = _model()
    _, probe = fixed_batch(model.config.vocab_size, 6, 4, 5, 6)
    probe = (probe[0], probe[1], probe[2].clone())
    probe[2][0, -2:] = 0  # halves with different token counts
    fit, held_out = split_probe(probe)
    base_fit, base_held_out = probe_base(model, probe).split(fit)
    for half, base in ((fit, base_fit), (held_out, base_held_out)):
        assert torch.equal(base.hidden, probe_base(model, half).hidden)
    assert base_fit.weight is base_held_out.weight
