"""GRPO's and the authors' REINFORCE advantages and losses against values computed by hand."""
import math

import pytest
import torch

from logra.rl.loss import (group_advantages, kl_k3, policy_loss, reinforce_loss,
                           running_baseline_advantages)


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, group_size=3)
    # group 1: mean 1/3, unbiased std sqrt(1/3); group 2: all equal -> 0
    s = math.sqrt(1 / 3) + 1e-4
    expected = [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    assert group_advantages(r, 3, scale=False).tolist() == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 0, 0, 0], rel=1e-6)
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(r, 4)


def test_policy_loss_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.6, 0.1], [0.9, 0.2, 0.3]]))
    old = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.9, 0.5, 0.3]]))
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # ratios: [1.25, 3.0, 1.0], [1.0, 0.4, 1.0]; clip to [0.8, 1.28]
    # seq 1 (A=+1): -min(1.25,1.25)= -1.25 ; -min(3, 1.28) = -1.28 ; masked
    # seq 2 (A=-2): -min(-2, -2)= 2 ; -min(-0.8, -1.6) = 1.6 ; 2
    tok = [-1.25, -1.28, 2.0, 1.6, 2.0]
    dapo = policy_loss(logp, old, adv, mask, 0.2, 0.28, "dapo")
    assert dapo.item() == pytest.approx(sum(tok) / 5, rel=1e-5)
    grpo = policy_loss(logp, old, adv, mask, 0.2, 0.28, "grpo")
    assert grpo.item() == pytest.approx(((-1.25 - 1.28) / 2 + (2 + 1.6 + 2) / 3) / 2, rel=1e-5)
    # micro-batches with a shared normalizer add up to the full-batch loss
    parts = [policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], 0.2, 0.28,
                         "dapo", normalizer=5) for i in range(2)]
    assert sum(parts).item() == pytest.approx(dapo.item(), rel=1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(logp, old, adv, mask, 0.2, 0.28, "sum")


def test_running_baseline_advantages_use_earlier_batches_only_by_hand():
    """Outcomes 1 where the reward is ≥ 1, else −0.01; A = outcome − b from earlier batches
    (b starts at 0), then b ← 0.9·b + 0.1·mean over the responses with tokens."""
    rewards, lengths = torch.tensor([1.0, 0.0, 1.5, 0.3]), torch.tensor([3, 2, 0, 4])
    adv, b = running_baseline_advantages(rewards, lengths, 0.0)
    assert adv.tolist() == pytest.approx([1.0, -0.01, 1.0, -0.01])
    assert b == pytest.approx(0.1 * (1.0 - 0.01 - 0.01) / 3)  # the empty response left out
    adv, b2 = running_baseline_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0]), lengths, b)
    assert adv.tolist() == pytest.approx([-0.01 - b, 1 - b, 1 - b, 1 - b])
    assert b2 == pytest.approx(0.9 * b + 0.1 * (-0.01 + 1 + 1) / 3)
    # from b = 0.2 with outcomes 1 and −0.01: 0.9·0.2 + 0.1·0.495
    assert running_baseline_advantages(torch.tensor([1.0, 0.0]), torch.tensor([2, 6]), 0.2)[
        1] == pytest.approx(0.2295)
    # length_reference: each advantage × L / its response's tokens (an empty one's: / 1)
    adv, _ = running_baseline_advantages(rewards, lengths, 0.2, length_reference=1024)
    assert adv.tolist() == pytest.approx([0.8 * 1024 / 3, -0.21 * 1024 / 2, 0.8 * 1024,
                                          -0.21 * 1024 / 4])
    adv, b = running_baseline_advantages(torch.tensor([math.nan, 1.0]), torch.tensor([2, 2]), 0.)
    assert math.isnan(adv[0]) and adv[1] == 1.0 and math.isnan(b)  # the loss will not be finite


def test_reinforce_loss_weighs_log_probs_by_the_truncated_detached_importance_weight():
    """d/d log π of the loss is −min(π/π_engine, 2)·A·mask / T: no ratio, the weight capped
    and detached (its own derivative would add a term); without engine log-probs it is 1."""
    probs = torch.tensor([[0.5, 0.6, 0.1], [0.9, 0.2, 0.3]])
    ratios = torch.tensor([[0.5, 3.0, 1.0], [1.0, 1.5, 2.5]])  # π_trainer / π_engine
    adv, mask = torch.tensor([1.0, -2.0]), torch.tensor([[1, 1, 0], [1, 1, 1]])
    logp = probs.log().requires_grad_()
    loss = reinforce_loss(logp, probs.log() - ratios.log(), adv, mask, cap=2.0)
    w = ratios.clamp(max=2.0)
    assert loss.item() == pytest.approx(
        (-(w * adv[:, None] * probs.log() * mask).sum() / 5).item(), rel=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -(w * adv[:, None] * mask) / 5)
    logp.grad = None
    reinforce_loss(logp, None, adv, mask).backward()
    assert torch.allclose(logp.grad, -(adv[:, None] * mask) / 5)


def test_policy_gradient_at_ratio_one_is_advantage_weighted_logp():
    logp = torch.randn(3, 4, requires_grad=True)
    adv, mask = torch.randn(3), torch.ones(3, 4)
    policy_loss(logp, logp.detach(), adv, mask, 0.2, 0.28, "dapo").backward()
    assert torch.allclose(logp.grad, -adv[:, None].expand(3, 4) / 12)


def test_kl_k3_is_zero_at_equality_and_positive():
    a, b = torch.randn(100), torch.randn(100)
    assert torch.all(kl_k3(a, a) == 0)
    assert torch.all(kl_k3(a, b) >= 0)


def test_kl_k3_estimates_kl_of_policy_from_reference_on_samples_of_the_policy():
    """kl_k3(logp, ref_logp) on tokens y ~ π is an unbiased estimate of KL(π ‖ ref): on a
    categorical, the mean over 200k samples of π is within 5 standard errors of the exact
    KL, and the swapped arguments are not (their mean is E_π[π/ref] - 1 - KL(π ‖ ref))."""
    gen = torch.Generator().manual_seed(0)
    pi = torch.tensor([0.6, 0.25, 0.1, 0.05])
    ref = torch.tensor([0.1, 0.2, 0.3, 0.4])
    kl = (pi * (pi / ref).log()).sum().item()  # 0.917 nats; swapped: 2.04
    y = torch.multinomial(pi, 200_000, replacement=True, generator=gen)
    logp, ref_logp = pi.log()[y], ref.log()[y]
    est = kl_k3(logp, ref_logp)
    assert abs(est.mean().item() - kl) < 5 * est.std().item() / math.sqrt(len(y))
    swapped = kl_k3(ref_logp, logp)
    assert abs(swapped.mean().item() - kl) > 20 * swapped.std().item() / math.sqrt(len(y))


# ------------------------------------------------------------------------------------------------
# token_logprobs: the textbook log-probs and their gradients, in chunks of tokens
# ------------------------------------------------------------------------------------------------

def _tiny(seed=0, **options):
    from transformers import AutoModelForCausalLM

    from logra.rl.models import tiny_config
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        **options))


def _textbook_logprobs(model, ids, attn, temperature):
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, -1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def _batch(vocab, rows=3, length=9):
    from logra.harness.memory_point import fixed_batch
    (ids, attn, mask, _), _ = fixed_batch(vocab, rows, 4, length - 4, 1)
    attn = attn.clone()
    attn[0, :2] = 0  # a left-padded row
    return ids, attn, mask


@pytest.mark.parametrize("tied,bias", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_gradients_equal_the_textbook_ones(tied, bias, temperature):
    from logra.rl.loss import token_logprobs
    model = _tiny(tie_word_embeddings=tied)
    if bias:  # an output layer with a bias
        head = model.get_output_embeddings()
        head.bias = torch.nn.Parameter(torch.randn(head.out_features) * 0.1)
    ids, attn, mask = _batch(model.config.vocab_size)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1)  # any downstream loss

    def grads(logp):
        model.zero_grad()
        (logp * weights * mask).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    want, want_grads = grads(_textbook_logprobs(model, ids, attn, temperature))
    for chunk in (1, 7, 10_000):
        got, got_grads = grads(token_logprobs(model, ids, attn, temperature, chunk))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for name, g in want_grads.items():
            torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-6,
                                       msg=f"{name}, chunk {chunk}")


def test_chunked_logprobs_under_bf16_autocast_follow_the_autocast_graph():
    from logra.rl.loss import token_logprobs
    model = _tiny()
    ids, attn, mask = _batch(model.config.vocab_size)
    out = []
    for fn in (_textbook_logprobs, lambda *a: token_logprobs(*a, 5)):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            logp = fn(model, ids, attn, 1.0)
        (logp * mask).sum().backward()
        out.append((logp.detach(), model.model.norm.weight.grad.clone()))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=0, atol=2e-2)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=5e-2, atol=5e-2)


def _loss_peak(vocab, rows, chunk):
    from logra.measure.memory import MemoryMeter
    from logra.rl.loss import token_logprobs
    model = _tiny(vocab_size=vocab)
    ids, attn, mask = _batch(vocab, rows, 40)
    with MemoryMeter("cpu") as meter:
        (token_logprobs(model, ids, attn, 1.0, chunk) * mask).sum().backward()
    return meter.report.net_peak_bytes


def test_loss_memory_grows_with_the_chunk_not_with_the_batch():
    vocab = 32768  # the vocabulary dominates the tiny model's activations
    row = vocab * 4  # one token's float32 logits
    small, large = _loss_peak(vocab, 2, 16), _loss_peak(vocab, 8, 16)
    wider = _loss_peak(vocab, 8, 64)
    whole = 6 * 40 * row  # one (sequences, positions, vocabulary) tensor for 6 more sequences
    assert large - small < 0.1 * whole, (small, large, whole)
    # one chunk-sized float32 tensor (48 tokens more per chunk), and transients of its size
    assert 0.5 * 48 * row <= wider - large <= 2.2 * 48 * row, (large, wider)


def test_batch_kl_is_the_k3_mean_over_the_batch_tokens_computed_directly():
    """accumulate_gradients hands the trainer's log-probs to `old_logp` (every row, over its
    micro-batches); after an update, batch_kl is the mean over the batch's completion tokens of
    k3(log π_old, log π_new), each side from a textbook full-logits forward."""
    from logra.harness.config import grpo_settings
    from logra.rl.step import accumulate_gradients, batch_kl
    g = grpo_settings({"micro_batch_size": 2, "temperature": 0.7})
    model = _tiny()
    ids, attn, mask = _batch(model.config.vocab_size, rows=6)
    with torch.no_grad():
        before = _textbook_logprobs(model, ids, attn, 0.7)
    old = torch.full_like(before, math.nan)
    accumulate_gradients(model, None, ids, attn, mask, torch.linspace(-1, 1, 6), g, old_logp=old)
    torch.testing.assert_close(old, before, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        d = (_textbook_logprobs(model, ids, attn, 0.7) - before).double()
    direct = (d.exp() - d - 1)[mask.bool()].mean().item()
    assert direct > 1e-4  # the update moved the policy
    assert batch_kl(model, ids, attn, mask, old, g) == pytest.approx(direct, rel=1e-4)


def test_policy_drift_is_the_exact_entropy_and_kl_summed_over_the_vocabulary(tiny_dir):
    """policy_drift's entropy and KL to the base equal −Σ p log p and Σ p (log p − log q) over
    the whole vocabulary, summed directly from full logits along the same seeded samples; the
    base against itself drifts by 0."""
    from logra.rl.drift import policy_drift
    from logra.rl.loop import pad_batch
    from logra.rl.models import load
    from logra.rl.rollout import generate_rollouts
    base, tok = load(tiny_dir)
    model, _ = load(tiny_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    prompts = ["Q: 1 2 -> 3\nA: ", "Q: 9 -> 9\nA: ", "Q: 4 4 4 -> 12\nA: "]
    got = policy_drift(model, base, tok, prompts, temperature=0.7, max_new_tokens=6, seed=3,
                       batch_size=2)
    entropy = kl = tokens = 0.0
    for i in (0, 2):  # the same batches, the same seed
        ids, attn, mask, _ = pad_batch(generate_rollouts(model, tok, prompts[i:i + 2], 1, 6, 0.7,
                                                         3), tok.pad_token_id)
        with torch.no_grad():
            pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
            logp, logq = (torch.log_softmax(m(input_ids=ids, attention_mask=attn,
                                                 position_ids=pos).logits[:, :-1].double() / 0.7,
                                               -1)[mask.bool()] for m in (model, base))
        entropy -= (logp.exp() * logp).sum().item()
        kl += (logp.exp() * (logp - logq)).sum().item()
        tokens += int(mask.sum())
    assert got["tokens"] == tokens > 0
    assert got["entropy"] == pytest.approx(entropy / tokens, rel=1e-4)
    assert got["kl_to_base"] == pytest.approx(kl / tokens, rel=1e-3) and kl > 0
    same = policy_drift(base, base, tok, prompts, temperature=0.7, max_new_tokens=6, seed=3)
    assert same["kl_to_base"] == pytest.approx(0, abs=1e-9) and same["entropy"] > 0
