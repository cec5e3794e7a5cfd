"""LoGRA as its authors wrote it (logra/optim/logra_rule.py, logra/optim/kl_control.py's
BudgetControl), against the arithmetic of their code (`skzhang1/RL`,
`nemo_rl/models/automodel/logra.py` and `logra_probe.py`), re-derived here by hand, one test per
invariant:

1. Differential conformance: 3 updates of the rule on a small HF Llama, at α = 1 and at given
   α, match weight by weight an independent reference of the arithmetic (projection seeds and
   draws, the sketch, RowAdam's row moments, the global normalisation, the factor's rounding,
   256-row chunks, the refresh count): within 1e-5 of the largest step plus 4 float32 ulps of
   the weight (the two differ in the order of float32 sums only) plus, with the bf16 factor,
   2⁻⁸ of the largest step (an element on a rounding boundary may round the other way); also
   with Gaussian projections, a float32 factor and no refresh. The projections are equal bit
   for bit.
2. S = G·Aᵀ of an explicit dense gradient over two micro-batches (float32: relative 1e-5).
3. The JVP prediction: |realized / predicted − 1| < 3% at update_ratio 1e-3 on completion
   tokens (the authors' own test), and the error shrinks as α → 0.
4. The budget schedule, α, the mismatch EMA and its floor at given counts and inputs; a zero
   prediction gives α = 1.
5. No weight-gradient tensor exists, and none is allocated during a step (the memory meter's
   gradient category holds the sketches and the embedding output's gradient only); frozen
   parameters never move.
6. A state saved with other options is refused; the state is plain data, loaded weights-only.
"""
from __future__ import annotations

import hashlib
import io
import math

import pytest
import torch

from logra.measure.memory import MemoryMeter
from logra.optim.kl_control import BudgetControl, predict_kl
from logra.optim.logra_rule import LoGRA, projection, projection_seed
from logra.rl.models import build_tiny, load

PROMPTS = ["Q: 12+3\nA: 15", "Q: 4+4\nA: 8", "Q: 7*6\nA: 42"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A small HF Llama whose widest target has more than 256 rows (the update's chunks)."""
    return build_tiny(tmp_path_factory.mktemp("llama") / "model", hidden_size=64,
                      intermediate_size=320, num_hidden_layers=2, num_attention_heads=4)


def batches(tok, n=3):
    gen = torch.Generator().manual_seed(11)
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    return [ids["input_ids"][torch.randperm(3, generator=gen)] for _ in range(n)]


# -- the reference, by hand ----------------------------------------------------------------------
def ref_seed(seed, update, name):
    name = ".".join(p for p in name.split(".")
                    if p not in ("_checkpoint_wrapped_module", "_fsdp_wrapped_module",
                                 "_orig_mod"))
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (seed * 1_000_003 + update * 7_919 + digest) % 2 ** 62


def ref_projection(rank, width, seed, distribution):
    gen = torch.Generator().manual_seed(seed)
    if distribution == "rademacher":
        bits = torch.randint(0, 2, (rank, width), generator=gen, dtype=torch.uint8)
        return (bits.float() * 2 - 1) / math.sqrt(rank)
    return (torch.randn(rank, width, generator=gen, dtype=torch.float64)
            / math.sqrt(rank)).float()


def reference_run(model_dir, tok, opts, alphas):
    """Weights after len(alphas) updates, from dense gradients of a hook-free copy."""
    model, _ = load(model_dir)
    r, seed, dist = opts["rank"], opts["seed"], opts.get("distribution", "rademacher")
    refresh = opts.get("refresh", True)
    fdtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[
        opts.get("update_factor_dtype", "bfloat16")]
    beta2, eps = 0.95, 1e-8
    targets = {n: m for n, m in model.named_modules()
               if n.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj",
                                            "gate_proj", "up_proj", "down_proj")}
    v = {n: torch.zeros(m.weight.shape[0], 1) for n, m in targets.items()}
    for k, (ids, alpha) in enumerate(zip(batches(tok, len(alphas)), alphas)):
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        index = k if refresh else 0
        a = {n: ref_projection(r, m.weight.shape[1], ref_seed(seed, index, n), dist)
             for n, m in targets.items()}
        tokens = ids.numel()
        dirs = {}
        for n, m in targets.items():
            s = (m.weight.grad @ a[n].T) / tokens
            v[n] = beta2 * v[n] + (1 - beta2) * (s * s).mean(dim=1, keepdim=True)
            root = torch.sqrt(v[n] / (1 - beta2 ** (k + 1)))
            den = root + max(eps * root.mean().item(), torch.finfo(torch.float32).tiny)
            scale = den.min() / den
            scale = scale / torch.sqrt((scale * scale).mean())
            d = scale * s
            dirs[n] = d * (s.norm() / d.norm())
        w_sq = sum(m.weight.double().square().sum() for m in targets.values())
        u_sq = sum((dirs[n].double() @ a[n].double()).square().sum() for n in targets)
        factor = opts["update_ratio"] * math.sqrt(w_sq / u_sq)
        with torch.no_grad():
            for n, m in targets.items():
                f = (dirs[n] * factor * alpha).to(fdtype).float()
                m.weight -= f @ a[n]
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", [
    {}, {"distribution": "gaussian"}, {"update_factor_dtype": "float32"}, {"refresh": False}])
def test_updates_match_a_hand_worked_reference(llama_dir, variant):
    model, tok = load(llama_dir)
    opts = {"rank": 4, "seed": 5, "update_ratio": 3e-3, "controller": False} | variant
    rule = LoGRA(model, **opts)
    assert max(t.weight.shape[0] for t in rule.targets) > 256  # several 256-row chunks
    alphas = [1.0, 0.37, 2.5]
    for ids, alpha in zip(batches(tok), alphas):
        start = rule.count if opts.get("refresh", True) else 0
        for t in rule.targets:  # the projection this update uses, bit for bit
            want = ref_projection(4, t.a.shape[1], ref_seed(5, start, t.name),
                                  opts.get("distribution", "rademacher"))
            assert torch.equal(t.a, want), t.name
        model(input_ids=ids, labels=ids).loss.backward()
        rule.batch_tokens = ids.numel()
        rule.apply(rule.propose(), alpha)
    assert rule.count == 3
    base = dict(load(llama_dir)[0].named_parameters())
    want = reference_run(llama_dir, tok, opts, alphas)
    for n, p in model.named_parameters():
        step = (want[n] - base[n]).abs().max().item()
        if n.rsplit(".", 2)[-2] not in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"):
            assert torch.equal(p.detach(), base[n]), n  # frozen
            continue
        assert step > 0, n
        # the two round W − F·A to float32 after sums in another order (a few ulps of W), and
        # an element of a bf16 factor on a rounding boundary may round the other way (2⁻⁸ of it)
        ulps = 4 * torch.finfo(torch.float32).eps * want[n].abs()
        flip = 2 ** -8 * step if opts.get("update_factor_dtype", "bfloat16") == "bfloat16" else 0
        assert ((p.detach() - want[n]).abs() <= 1e-5 * step + flip + ulps).all(), n


def test_projection_seed_ignores_wrapper_parts_and_follows_the_count():
    name = "model.layers.0.self_attn.q_proj"
    wrapped = "model.layers.0._checkpoint_wrapped_module.self_attn._orig_mod.q_proj"
    assert projection_seed(3, 2, wrapped) == projection_seed(3, 2, name) == ref_seed(3, 2, name)
    assert projection_seed(3, 1, name) != projection_seed(3, 2, name)
    a = projection(8, 16, 123)
    scale = torch.tensor(1 / math.sqrt(8), dtype=torch.float32).item()
    assert set(a.flatten().tolist()) == {-scale, scale}


def test_the_sketch_is_the_dense_gradient_times_the_projection(llama_dir):
    model, tok = load(llama_dir)
    rule = LoGRA(model, rank=4)
    plain, _ = load(llama_dir)
    for ids in batches(tok, 2):  # two micro-batches
        model(input_ids=ids, labels=ids).loss.backward()
        plain(input_ids=ids, labels=ids).loss.backward()
    grads = dict(plain.named_parameters())
    for t in rule.targets:
        want = grads[f"{t.name}.weight"].grad @ t.a.T
        torch.testing.assert_close(t.s, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert all(p.grad is None for p in model.parameters())


def _completion_probe(tok, model):
    """A probe whose mask marks the answer tokens only (as the loop's completion masks do)."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.long)
    for i in range(len(PROMPTS)):
        answer = len(PROMPTS[i].split("A: ")[1])
        mask[i, ids.shape[1] - 1 - answer:] = 1  # positions whose next token is the answer's
    return ids, attn, mask


def _realized_kl(model, probe, change):
    ids, attn, mask = probe
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        before = torch.log_softmax(model(input_ids=ids, attention_mask=attn,
                                         position_ids=pos).logits.double(), -1)
        change()
        after = torch.log_softmax(model(input_ids=ids, attention_mask=attn,
                                        position_ids=pos).logits.double(), -1)
    kl = (before.exp() * (before - after)).sum(-1)[:, :-1]
    return kl[mask.bool()].mean().item()


def test_the_jvp_prediction_matches_the_realized_kl(llama_dir):
    errors = []
    for alpha in (1.0, 0.1):
        model, tok = load(llama_dir)
        rule = LoGRA(model, rank=8, update_ratio=1e-3, update_factor_dtype="float32")
        ids = batches(tok, 1)[0]
        model(input_ids=ids, labels=ids).loss.backward()
        rule.batch_tokens = ids.numel()
        step = rule.propose()
        probe = _completion_probe(tok, model)
        predicted = predict_kl(model, rule, step, probe, 1.0, 3, 4096) * alpha ** 2
        realized = _realized_kl(model, probe, lambda: rule.apply(step, alpha))
        errors.append(abs(realized / predicted - 1))
    assert errors[0] < 0.03, errors
    assert errors[1] < errors[0], errors


def test_budget_alpha_and_mismatch_at_given_inputs():
    c = BudgetControl(kl_budget=2e-4, kl_budget_final=2e-5, schedule_steps=11, alpha_max=3.0,
                      mismatch_ema_weight=0.3, mismatch_budget_floor=0.5)
    assert c.budget(0) == pytest.approx(2e-4)  # the first update gets the full budget
    assert c.budget(5) == pytest.approx(2e-5 + 0.5 * 1.8e-4)  # half way: the cosine's middle
    assert c.budget(10) == pytest.approx(2e-5) == c.budget(50)
    # the EMA starts at 0, no bias correction, updated before the budget is reduced
    assert c.effective_budget(0, 1e-4) == pytest.approx(2e-4 - 0.3 * 1e-4)
    assert c.mismatch == pytest.approx(3e-5)
    assert c.effective_budget(0, -5.0) == pytest.approx(2e-4 - 0.7 * 3e-5)  # clamped at 0
    assert c.mismatch == pytest.approx(2.1e-5)
    assert c.effective_budget(0, 1.0) == pytest.approx(1e-4)  # floored at half the budget
    before = c.mismatch
    assert c.effective_budget(0, math.nan) == pytest.approx(2e-4)  # no completed response:
    assert c.mismatch == before  # neither the EMA nor the budget changes
    assert c.alpha(8e-3, 2e-4) == pytest.approx(math.sqrt(2e-4 / 8e-3))
    assert c.alpha(1e-12, 2e-4) == 3.0 and c.alpha(0.0, 2e-4) == 1.0
    for bad in (math.nan, math.inf, -1e-9):  # raised, as the authors' (never the largest α)
        with pytest.raises(FloatingPointError, match="predicted KL"):
            c.alpha(bad, 2e-4)
    off = BudgetControl(mismatch_subtraction=False)
    assert off.effective_budget(0, 1e-4) == pytest.approx(2e-4) and off.mismatch == 0


def test_no_weight_gradient_is_allocated_and_frozen_weights_stay(llama_dir):
    model, tok = load(llama_dir)
    rule = LoGRA(model, rank=4, update_ratio=3e-3, controller=False)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()
              if not any(n == f"{t.name}.weight" for t in rule.targets)}
    ids = batches(tok, 1)[0]
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up: buffers exist before the region
    rule.batch_tokens = ids.numel()
    rule.apply(rule.propose())
    with MemoryMeter("cpu", labels={"grads": rule.grad_buffers(),
                                    "optimizer": rule.state_tensors()}) as meter:
        model(input_ids=ids, labels=ids).loss.backward()
        rule.apply(rule.propose())
    # the sketches, and the gradient of the embedding's output (the leaf that lets backward
    # reach the blocks: tokens x hidden); no weight gradient
    sketches = sum(t.s.numel() * 4 for t in rule.targets)
    assert meter.report.category_max["grads"] == sketches + ids.numel() * 64 * 4
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p.detach(), frozen[n]), n


def test_a_state_with_other_options_is_refused_and_loads_weights_only(llama_dir):
    model, tok = load(llama_dir)
    rule = LoGRA(model, rank=4, seed=1)
    ids = batches(tok, 1)[0]
    model(input_ids=ids, labels=ids).loss.backward()
    rule.apply(rule.propose())
    buffer = io.BytesIO()
    torch.save(rule.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    other = LoGRA(load(llama_dir)[0], rank=4, seed=1, update_ratio=1e-3)
    with pytest.raises(ValueError, match=r"other options \(update_ratio: 6e-05 saved, 0.001 now"):
        other.load_state_dict(state)
    same = LoGRA(load(llama_dir)[0], rank=4, seed=1)
    same.load_state_dict(state)
    assert same.count == 1
    assert all(torch.equal(a.a, b.a) and torch.equal(a.v, b.v)
               for a, b in zip(rule.targets, same.targets))


def test_the_update_cosine_diagnostic_and_the_memory_measure_leave_the_run_as_it_is(
        tmp_path, tiny_dir):
    """At grpo.cosine_step the run keeps the batch's dense gradient once and records
    cos(ΔW, −G); the memory profiler watches steps 1 and 3 (grpo.measure_memory). A LoGRA run
    with the diagnostic and without the profiler ends at the weights of one with the profiler
    and without the diagnostic, bit for bit: neither changes the run. LoGRA's step is a descent
    direction (cos > 0: ⟨D·A, G⟩ = Σ_rows scale·‖(G·Aᵀ)_row‖²/T > 0), as dense Adam's (whose
    gradients are dense already: its diagnostic only reads them)."""
    from runs import make_run, weights

    from logra.rl.loop import train
    cosines = {}
    for method in ("logra", "dense_adam"):
        (tmp_path / method).mkdir()
        cfg, train_jsonl = make_run(tmp_path / method, method)
        cfg["grpo"].update(checkpoint_every=0, steps=3)
        if method == "logra":
            plain = train(cfg, tiny_dir, train_jsonl, tmp_path / method / "plain")
            assert plain["update_cosine"] is None and plain["peak_mem_bytes"] > 0
        cfg["grpo"].update(cosine_step=2, measure_memory=False)
        diag = train(cfg, tiny_dir, train_jsonl, tmp_path / method / "diag")
        assert diag["update_cosine"]["step"] == 2 and diag["peak_mem_bytes"] is None
        cosines[method] = diag["update_cosine"]["cosine"]
    assert all(0 < c <= 1 for c in cosines.values()), cosines
    a, b = weights(tmp_path / "logra" / "plain"), weights(tmp_path / "logra" / "diag")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_sequences_sharing_a_forward_predict_what_one_at_a_time_predicts(llama_dir):
    """predict_kl runs sequences together while their kept logits fit chunk_tokens: the same
    prediction (float32 forwards: relative 1e-5) as the authors' one sequence per forward
    (chunk_tokens=1), and a cut at max_tokens only drops positions."""
    model, tok = load(llama_dir)
    rule = LoGRA(model, rank=4, update_ratio=1e-3)
    ids = batches(tok, 1)[0]
    model(input_ids=ids, labels=ids).loss.backward()
    step = rule.propose()
    probe = _completion_probe(tok, model)
    shared = predict_kl(model, rule, step, probe, 1.0, 3, 4096)
    alone = predict_kl(model, rule, step, probe, 1.0, 3, 4096, chunk_tokens=1)
    assert shared == pytest.approx(alone, rel=1e-5)
    short = probe[0].shape[1] - 2  # each sequence loses its last two positions at most
    cut = predict_kl(model, rule, step, probe, 1.0, 3, short)
    assert cut != shared and cut > 0


@pytest.mark.parametrize("variant", [{}, {"refresh": False, "distribution": "gaussian"}])
def test_the_engine_draws_the_projections_from_their_seeds(llama_dir, variant):
    """LoGRA's low-rank payload holds the factors and the projections' seeds, no projection
    matrix; the engine (logra.rl.weight_sync.apply_payload) draws each projection from its seed
    equal to the one the trainer applied with (the reference's, by hand), and after each sync
    holds the trainer's weights bit for bit (float32)."""
    from logra.rl.weight_sync import apply_payload, deserialize, serialize
    model, tok = load(llama_dir)
    opts = {"rank": 4, "seed": 5, "update_ratio": 3e-3, "controller": False} | variant
    rule = LoGRA(model, **opts)
    engine = {n: p.detach().clone() for n, p in model.named_parameters()}
    bases = {}
    for k, ids in enumerate(batches(tok)):
        model(input_ids=ids, labels=ids).loss.backward()
        rule.batch_tokens = ids.numel()
        rule.apply(rule.propose(), 0.5)
        payload = rule.sync_payload()
        entries = payload["lowrank"]
        assert set(payload) == {"lowrank"} and len(entries) == len(rule.targets)
        for t in rule.targets:
            e = entries[f"{t.name}.weight"]
            tensors = [v for v in e.values() if isinstance(v, torch.Tensor)]
            assert [v.shape for v in tensors] == [(t.weight.shape[0], 4)]  # the factor only
        apply_payload(engine, deserialize(serialize(payload)), bases)
        update = k if opts.get("refresh", True) else 0
        for t in rule.targets:
            seed, a = bases[f"{t.name}.weight"]
            assert seed == ref_seed(5, update, t.name)
            assert torch.equal(a, ref_projection(4, t.weight.shape[1], seed,
                                                 opts.get("distribution", "rademacher")))
        for n, p in model.named_parameters():
            assert torch.equal(engine[n], p.detach()), (k, n)
        assert rule.sync_payload() == {"lowrank": {}}  # a step is never sent twice


def test_a_tuning_point_sets_the_kl_budget_and_moves_the_step_by_its_root():
    """The sweep's knob is the budget: the final budget keeps its proportion and update_ratio
    scales by √(point / budget), task by task where given per task (the α = 1 step's predicted
    KL keeps its ratio to the budget); without the controller the knob is the step size."""
    options = {"update_ratio": {"a": 1e-3, "default": 4e-3}, "kl_budget": 1e-4, "rank": 8}
    assert LoGRA.tuning_option(options) == "kl_budget"
    assert LoGRA.tuned(options, 4e-4) == {"rank": 8, "kl_budget": 4e-4,
                                          "kl_budget_final": 8e-5,  # the default 2e-5 x 4
                                          "update_ratio": {"a": 2e-3, "default": 8e-3}}
    again = LoGRA.tuned(LoGRA.tuned(options, 9e-4), 4e-4)  # from another point of the family
    assert again == LoGRA.tuned(options, 4e-4)
    plain = {"controller": False, "update_ratio": 1e-3}
    assert LoGRA.tuning_option(plain) == "update_ratio"
    assert LoGRA.tuned(plain, 5e-3) == {"controller": False, "update_ratio": 5e-3}


def test_neighbouring_points_of_its_tuning_grid_are_a_factor_apart_in_step_size(llama_dir):
    """The tuning grid's law (logra.harness.derived.grid_values): LoGRA's knob, the KL budget,
    moves as the step squared (`tuning_power` 2), so neighbouring points of its grid, budgets
    factor² apart with update_ratio following (`tuned`), get the same α from the controller
    (the α = 1 step's predicted KL grows as its size squared) and move the weights by steps a
    factor apart, as neighbouring lrs of a dense grid do."""
    factor, options = 2.0, {"rank": 8, "update_factor_dtype": "float32", "kl_budget": 2e-6,
                            "update_ratio": 1e-3}
    assert LoGRA.tuning_power(options) == 2
    assert LoGRA.tuning_power({**options, "controller": False}) == 1
    alphas, moves = [], []
    for budget in (2e-6, 2e-6 * factor ** 2):
        model, tok = load(llama_dir)
        rule = LoGRA(model, **LoGRA.tuned(options, budget))
        ids = batches(tok, 1)[0]
        model(input_ids=ids, labels=ids).loss.backward()
        rule.batch_tokens = ids.numel()
        step = rule.propose()
        predicted = predict_kl(model, rule, step, _completion_probe(tok, model), 1.0, 3, 4096)
        alphas.append(rule.control.alpha(predicted, rule.control.budget(0)))
        before = [p.detach().clone() for p in model.parameters()]
        rule.apply(step, alphas[-1])
        moves.append(math.sqrt(sum((p.detach() - b).double().square().sum().item()
                                   for p, b in zip(model.parameters(), before))))
    assert alphas[0] < rule.control.alpha_max  # the controller sets α, not its cap
    assert alphas[1] == pytest.approx(alphas[0], rel=1e-4)
    assert moves[1] / moves[0] == pytest.approx(factor, rel=1e-3)
