"""GRPO advantages and loss against values computed by hand."""
import math

import pytest
import torch

from logra.grpo import group_advantages, kl_k3, policy_loss


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
