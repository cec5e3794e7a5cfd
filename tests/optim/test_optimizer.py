"""LoGRAOptimizer refuses what would corrupt the caller's model, and every refusal leaves the
model's weights bit for bit as they were (logra/optim/optimizer.py, "Guards")."""
import copy
import math
import pickle

import pytest
import torch

from logra.optim.optimizer import LoGRAOptimizer
from logra.rl.models import load


@pytest.fixture
def model(tiny_dir):
    return load(tiny_dir)[0]


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def unchanged(model, before):
    return all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def backward(model, seed=0):
    ids = torch.randint(3, 98, (2, 12), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids, labels=ids).loss.backward()
    return ids


@pytest.mark.parametrize("options, message", [
    ({"update_ratio": math.nan}, r"update_ratio: a finite number in \(0, 1\], got nan"),
    ({"update_ratio": math.inf}, r"update_ratio: a finite number in \(0, 1\], got inf"),
    ({"update_ratio": 1e6}, r"update_ratio: a finite number in \(0, 1\], got 1000000.0"),
    ({"epsilon": math.nan}, r"epsilon: a finite number in \(0, inf\), got nan"),
    ({"kl_budget": -1}, r"kl_budget: a finite number in \(0, inf\), got -1"),
    ({"rank": 2.5}, r"rank: an integer >= 1, got 2.5"),
    ({"rank": True}, r"rank: an integer >= 1, got True"),
    ({"controller": "no"}, r"controller: true or false, got 'no'"),
    ({"max_step_ratio": 0}, r"max_step_ratio: a finite number > 0 or None, got 0"),
    ({"rank": 1000}, r"rank=1000 exceeds the input width"),
])
def test_bad_options_are_refused_before_the_model_is_touched(model, options, message):
    before, grads = snapshot(model), [p.requires_grad for p in model.parameters()]
    with pytest.raises(ValueError, match=message):
        LoGRAOptimizer(model, **options)
    assert unchanged(model, before) and [p.requires_grad for p in model.parameters()] == grads
    assert not model.model.layers[0].self_attn.q_proj._forward_hooks  # no hook left behind


def test_a_model_without_input_embeddings_is_refused_before_it_is_frozen(model):
    class Bare(torch.nn.Module):  # q_proj and friends, but no get_input_embeddings
        def __init__(self, inner):
            super().__init__()
            self.layers = inner.model.layers
    bare = Bare(model)
    with pytest.raises(TypeError, match="Bare has no get_input_embeddings"):
        LoGRAOptimizer(bare, rank=2)
    assert all(p.requires_grad for p in bare.parameters())
    assert not bare.layers[0].self_attn.q_proj._forward_hooks


def test_steps_that_would_corrupt_the_weights_are_refused_and_change_nothing(model):
    opt = LoGRAOptimizer(model, rank=2, update_ratio=1e-2, controller=False)
    before = snapshot(model)
    opt.normalization_tokens = 10
    with pytest.raises(RuntimeError, match="no backward pass reached LoGRA's target weights"):
        opt.step()  # no backward since the last step: a silent no-op that counted an update
    assert unchanged(model, before) and opt.update_count == 0
    backward(model)
    with pytest.raises(ValueError, match=r"relative size 1e\+28 .* exceeds max_step_ratio 0.1"):
        opt.step(alpha=1e30)
    assert unchanged(model, before) and opt.update_count == 0
    opt.max_step_ratio = None  # unbounded: the factor check still stands
    with pytest.raises(ValueError, match=r"could make model.layers.0.self_attn.q_proj.weight "
                                         r"non-finite"):
        opt.step(alpha=1e40)
    assert unchanged(model, before) and opt.update_count == 0
    opt.step(alpha=1.0)  # the prepared step was kept
    assert not unchanged(model, before) and opt.update_count == 1
    opt.zero_grad()


def test_a_step_whose_gradient_is_zero_still_steps(model):
    """Equal rewards give a zero gradient: a real backward pass, and a step (the count and the
    projections advance, the weights stay)."""
    opt = LoGRAOptimizer(model, rank=2, controller=False)
    before = snapshot(model)
    ids = torch.randint(3, 98, (2, 12))
    (0.0 * model(input_ids=ids, labels=ids).loss).backward()
    opt.normalization_tokens = 10
    opt.step()
    assert opt.update_count == 1 and unchanged(model, before)


@pytest.mark.parametrize("tokens", [-5, 2.5, True])
def test_a_token_count_that_is_not_one_is_refused(model, tokens):
    opt = LoGRAOptimizer(model, rank=2, controller=False)
    backward(model)
    before = snapshot(model)
    opt.normalization_tokens = tokens
    with pytest.raises(ValueError, match="normalization_tokens is a count of tokens"):
        opt.step()
    assert unchanged(model, before)
    with pytest.raises(ValueError, match="count_tokens: a count of tokens"):
        opt.count_tokens(-1)


@pytest.mark.parametrize("ids", [torch.ones(12, dtype=torch.long), torch.ones(2, 12)])
def test_a_probe_that_is_not_token_ids_is_refused(model, ids):
    opt = LoGRAOptimizer(model, rank=2)
    with pytest.raises(ValueError, match="input_ids must be a 2-D tensor of token ids"):
        opt.set_probe(ids)


def test_another_models_or_optimizers_state_is_refused_before_anything_changes(model,
                                                                               tiny_dir):
    from logra.rl.models import build_tiny
    opt = LoGRAOptimizer(model, rank=2, controller=False)
    for _ in range(3):
        backward(model)
        opt.normalization_tokens = 10
        opt.step()
        opt.zero_grad()
    wide = build_tiny(tiny_dir.parent / "wide", hidden_size=96, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4)
    other = LoGRAOptimizer(load(wide)[0], rank=2, controller=False)
    with pytest.raises(ValueError, match=r"q_proj's row moment is \(64, 1\) in the state, "
                                         r"\(96, 1\) here"):
        other.load_state_dict(opt.state_dict())
    assert other.update_count == 0
    adamw = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()).state_dict()
    with pytest.raises(ValueError, match="not a LoGRAOptimizer's state"):
        other.load_state_dict(adamw)
    assert other.update_count == 0


def test_parameter_groups_are_fixed_and_the_optimizer_is_not_pickled(model):
    opt = LoGRAOptimizer(model, rank=2)
    with pytest.raises(TypeError, match="add_param_group is not supported"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        pickle.dumps(opt)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.deepcopy(opt)
