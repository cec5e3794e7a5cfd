"""The peers' own claims: 8-bit AdamW's state is 8-bit and the size it says, Adam-mini keeps one
second moment per block, APOLLO's projections follow the run's seed, LoRA's adapter sync sends
r·(m + n) values per module and the engine still equals the trainer."""
import io

import pytest
import torch
from torch._dynamo.utils import counters
from torchao.optim.subclass_8bit import OptimState8bit

from logra import rules
from logra.measure.planner import sync_bytes
from logra.rl.models import load
from logra.rl.weight_sync import apply_payload, payload_bytes

PROMPTS = ["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"]


def _step(model, tok, rule):
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    rule.apply(rule.propose(), 1.0)


def test_adamw_8bit_state_is_uint8_codes_and_the_bytes_it_claims(tiny_dir):
    model, tok = load(tiny_dir)
    rule = rules.build("adamw_8bit", model, {"lr": 1e-3})
    _step(model, tok, rule)
    quantized_weights, expected = 0, 0
    for p in model.parameters():
        state = rule.optimizer.state[p]
        expected += state["step"].nbytes
        for key in ("exp_avg", "exp_avg_sq"):
            s = state[key]
            if p.numel() >= 4096 and p.numel() % 256 == 0:  # torchao quantizes these
                assert isinstance(s, OptimState8bit), key
                assert s.codes.dtype == torch.uint8 and s.codes.shape == p.shape
                assert s.scale.dtype == torch.float32 and s.scale.numel() == p.numel() // 256
                expected += s.codes.nbytes + s.scale.nbytes + s.qmap.nbytes
                quantized_weights += p.numel() if key == "exp_avg" else 0
            else:
                assert type(s) is torch.Tensor and s.dtype == torch.float32
                expected += s.nbytes
    # the tiny model's projections and MLP weights are quantized: most of its weights
    assert quantized_weights > 0.5 * sum(p.numel() for p in model.parameters())
    assert rule.state_bytes() == expected
    fp32 = 8 * sum(p.numel() for p in model.parameters())
    assert rule.state_bytes() < 0.5 * fp32  # not two fp32 moments under an 8-bit name
    # a checkpoint keeps the codes 8-bit
    buffer = io.BytesIO()
    torch.save(rule.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    codes = [s["exp_avg"].codes for s in saved["state"].values()
             if isinstance(s["exp_avg"], OptimState8bit)]
    assert codes and all(c.dtype == torch.uint8 for c in codes)


def test_adamw_8bit_compiles_before_the_first_step(tiny_dir):
    """On CPU a run's step 1 is measured under the memory profiler, which must not see
    torchao's compile: the rule compiles every update in its constructor."""
    torch._dynamo.reset()
    model, tok = load(tiny_dir)
    before = [p.detach().clone() for p in model.parameters()]
    rule = rules.build("adamw_8bit", model, {"lr": 1e-3})
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not rule.optimizer.state  # the throwaway steps leave this optimizer's state empty
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as a bf16 run's update step
        rule.apply(rule.propose(), 1.0)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled in the first step
    assert rule.optimizer.state
    with torch.device("meta"):  # the config check's meta model: nothing to compile
        rules.build("adamw_8bit", torch.nn.Linear(256, 256), {"lr": 1e-3})
    assert counters["stats"]["unique_graphs"] == graphs


def test_adam_mini_keeps_one_second_moment_per_block(tiny_dir):
    model, tok = load(tiny_dir)
    rule = rules.build("adam_mini", model, {"lr": 1e-3})
    _step(model, tok, rule)
    heads = model.config.num_attention_heads
    for name, p in model.named_parameters():
        state = rule.optimizer.state[p]
        assert state["m"].numel() == p.numel(), name  # the first moment stays per weight
        v = state["vmean"].numel()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            assert v == heads, name
        elif "norm" in name:
            assert v == 1, name
        else:  # embeddings, lm_head, v/o projections, MLP: one per row
            assert v == p.shape[0], name


def test_apollo_projections_follow_the_runs_seed(tiny_dir):
    def projection(seed):
        torch.manual_seed(seed)
        model, tok = load(tiny_dir)
        rule = rules.build("apollo", model, {"rank": 1, "scale_type": "tensor"})
        _step(model, tok, rule)
        return next(s["projector"].ortho_matrix for s in rule.optimizer.state.values()
                    if "projector" in s)
    assert torch.equal(projection(0), projection(0))
    assert not torch.equal(projection(0), projection(1))


def test_lora_adapter_sync_sends_the_factors_and_the_engine_equals_the_trainer(tiny_dir):
    options = {"lr": 1e-2, "rank": 2, "dense_modules": "lm_head", "dense_lr": 1e-3}
    model, tok = load(tiny_dir)
    rule = rules.build("lora", model, options)
    engine, bases = {n: w.clone() for n, w in rule.engine_weights().items()}, {}
    shapes = {f"{n}.weight": tuple(layer.get_base_layer().weight.shape)
              for n, layer in rule.layers.items()}
    for _ in range(2):
        _step(model, tok, rule)
        payload = rule.sync_payload()
        # r·(m + n) fp32 values per adapted module, and the densely trained lm_head in full
        factors = sum(2 * (m + n) * 4 for m, n in shapes.values())
        assert payload_bytes(payload) == factors + model.lm_head.weight.nbytes
        assert payload_bytes(payload) == sync_bytes(model.config, "lora", options)
        assert payload_bytes(payload) < sum(4 * m * n for m, n in shapes.values())
        apply_payload(engine, payload, bases)
        for n, w in rule.engine_weights().items():
            assert torch.equal(engine[n], w), n

    # resumed: a new engine restored with the merged weights is sent each base once
    state = rule.state_dict()
    rule.load_state_dict(state)
    engine, bases = {n: w.clone() for n, w in rule.engine_weights().items()}, {}
    for expect_base in (True, False):
        _step(model, tok, rule)
        payload = rule.sync_payload()
        assert all((e["base"] is not None) == expect_base for e in payload["lora"].values())
        apply_payload(engine, payload, bases)
        for n, w in rule.engine_weights().items():
            assert torch.equal(engine[n], w), n


def test_lora_dense_head_trains_sketch_adams_dense_set(tiny_dir):
    """lora_dense_head's trainable set: the adapters, and every weight sketch_adam trains
    densely."""
    model, _ = load(tiny_dir)
    sketched = rules.build("sketch_adam", model, {"rank": 2})
    dense = {n for n, _ in sketched.dense.named}
    model, _ = load(tiny_dir)
    rule = rules.build("lora", model, {"rank": 1, "dense_modules": "embed_tokens|lm_head|norm"})
    assert {n for n, _ in rule.dense_named} == dense
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == dense | {n for n in trained if ".lora_" in n}


def test_bf16_weights_keep_steps_below_half_their_resolution_only_by_stochastic_rounding(tiny_dir):
    """At the lr the sweep tunes here (5e-5; the LoGRA authors' AdamW runs at 1e-6), an Adam step
    on a bf16 weight of magnitude >= 2^-6 is below half its resolution (2^-13 there): rounded to
    nearest the weight does not move; rounded stochastically it moves by the steps' sum in
    expectation. Ten steps along one gradient sign (each Adam step is then lr): with
    `bf16_stochastic_round` those weights move 10 x lr on average, without it hardly at all."""
    lr, steps = 5e-5, 10
    moved = {}
    for rounding in (False, True):
        torch.manual_seed(0)
        model, _ = load(tiny_dir, dtype=torch.bfloat16)
        rule = rules.build("adamw_8bit", model, {"lr": lr, "bf16_stochastic_round": rounding})
        before = {n: p.detach().float().clone() for n, p in rule.named}
        signs = {n: torch.sign(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
                 for n, p in rule.named}
        for _ in range(steps):
            for n, p in rule.named:
                p.grad = signs[n].to(p.dtype)
            rule.apply(rule.propose(), 1.0)
        coarse = [((before[n] - p.detach().float()) * signs[n])[before[n].abs() >= 2 ** -6]
                  for n, p in rule.named]
        moved[rounding] = torch.cat(coarse)
    assert moved[False].numel() > 10_000
    # rounded to nearest, all but the few at the lower edge of a power of two (the resolution
    # below it is twice as fine) stay where they were: 3% of the steps' sum on average
    assert torch.count_nonzero(moved[False]) < 0.01 * moved[False].numel()
    assert moved[False].mean().item() < 0.05 * steps * lr
    assert moved[True].mean().item() == pytest.approx(steps * lr, rel=0.1)
    with pytest.raises(ValueError, match=r"bf16_stochastic_round rounds bf16 weights; these are "
                       r"torch.float32 \(set the method's grpo.param_dtype: bfloat16\)"):
        rules.build("adamw_8bit", load(tiny_dir)[0], {"bf16_stochastic_round": True})
