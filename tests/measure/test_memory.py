"""logra.measure.memory and .activations: the measured peak vs. the analytic breakdown (CPU,
tiny Qwen2)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from logra.harness.config import grpo_settings
from logra.measure.activations import (
    activation_breakdown,
    activation_bytes_estimate,
    analytic_breakdown,
    saved_tensor_bytes,
)
from logra.measure.memory import (MemoryMeter, MemoryProfilerAPIError, MemoryReport,
                                  optimizer_state_bytes)
from logra.measure.timeline import CATEGORY_KEYS
from logra.optim.rule import tensor_bytes

VOCAB = 100
SEQ = 64


def _config(**kw) -> Qwen2Config:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return Qwen2Config(**base)  # ~1.0M parameters with the defaults above


def _model(cfg: Qwen2Config, attn: str = "sdpa", dtype=torch.float32) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).to(dtype)
    m.config._attn_implementation = attn
    m.train()
    return m


def _tokens(batch: int, seq: int = SEQ) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


# ------------------------------------------------------------------------------------------------
# 1. tensor_bytes
# ------------------------------------------------------------------------------------------------


def test_tensor_bytes_dedupes_shared_storage():
    a = torch.zeros(10, 10)  # 400 B
    b = torch.zeros(5, dtype=torch.float64)  # 40 B
    view = a[2:4]  # same storage as a
    alias = a.view(100)
    assert tensor_bytes([a]) == 400
    assert tensor_bytes([a, view, alias, None, b, b]) == 440
    assert tensor_bytes([]) == 0

    tied = _model(_config(tie_word_embeddings=True, num_hidden_layers=1))
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    # parameters() already dedupes Parameters; listing both tied tensors must not double count
    unique = sum(p.numel() * p.element_size() for p in tied.parameters())
    both = list(tied.parameters()) + [tied.lm_head.weight]
    assert tensor_bytes(both) == unique


# ------------------------------------------------------------------------------------------------
# Activation formula == what autograd actually saves (exact, no profiler)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attn,dtype,mask,kv_heads",
    [
        ("eager", torch.float32, False, 2),
        ("sdpa", torch.float32, False, 2),
        ("sdpa", torch.float32, True, 2),
        ("eager", torch.bfloat16, True, 4),
        ("sdpa", torch.bfloat16, False, 4),
    ],
)
def test_activation_estimate_matches_saved_tensors_exactly(attn, dtype, mask, kv_heads):
    cfg = _config(num_hidden_layers=2, num_key_value_heads=kv_heads, head_dim=48)
    m = _model(cfg, attn, dtype)
    B, T = 3, 40
    x = _tokens(B, T)
    kw = dict(input_ids=x, labels=x)
    if mask:
        am = torch.ones(B, T, dtype=torch.long)
        am[0, :5] = 0  # left padding
        kw["attention_mask"] = am
    _, saved = saved_tensor_bytes(m, exclude=list(m.parameters()) + [x], **kw)
    est = activation_bytes_estimate(
        cfg,
        B,
        T,
        dtype_bytes=torch.finfo(dtype).bits // 8,
        attn_implementation=attn,
        attention_mask=mask,
    )
    assert est == saved


def test_activation_estimate_signature_and_checkpointing():
    cfg = _config()
    full = activation_bytes_estimate(cfg, 4, SEQ)
    assert activation_bytes_estimate(cfg, n_tokens=4 * SEQ, seq_len=SEQ) == full
    ck = activation_breakdown(cfg, 4, SEQ, checkpointing=True)
    nock = activation_breakdown(cfg, 4, SEQ)
    N, H, L = 4 * SEQ, cfg.hidden_size, cfg.num_hidden_layers
    assert ck["total"] == L * N * H * 4 + max(nock["per_layer"], nock["head"]) + nock["rope"]
    assert ck["total"] < full
    with pytest.raises(TypeError):
        activation_bytes_estimate(cfg, n_tokens=100)  # no seq_len
    d = analytic_breakdown(
        param_bytes=1, grad_bytes_at_peak=2, optimizer_bytes=3, activation_bytes=4, rollout_bytes=5
    )
    assert d == dict(weights=1, grads=2, optimizer=3, activations=4, rollout=5, other=0, total=15)


# ------------------------------------------------------------------------------------------------
# Measured steps (shared fixtures so each profiled step runs once)
# ------------------------------------------------------------------------------------------------


def _adamw_step_report(batch: int):
    cfg = _config()
    m = _model(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = _tokens(batch)

    def step():
        out = m(input_ids=x, labels=x)
        out.loss.backward()
        del out
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: creates AdamW state, so the measured step is a steady-state step
    with MemoryMeter("cpu") as mm:
        step()
    sizes = dict(
        params=tensor_bytes(m.parameters()),
        grads=tensor_bytes(m.parameters()),  # one fp32 grad per fp32 param
        optimizer=optimizer_state_bytes(opt),
        activations=activation_bytes_estimate(cfg, batch, SEQ),
        n_params=sum(p.numel() for p in m.parameters()),
    )
    return mm.report, sizes


@pytest.fixture(scope="module")
def adamw_b4():
    return _adamw_step_report(4)


@pytest.fixture(scope="module")
def adamw_b8():
    return _adamw_step_report(8)


def _fmt(r: MemoryReport, sizes: dict) -> str:
    return (
        f"peak={r.peak_bytes} pre={r.preexisting_bytes} by_category={r.by_category} "
        f"raw={r.by_profiler_category} category_max={r.category_max} sizes={sizes} "
        f"region={r.elapsed_s:.2f}s analysis={r.analysis_s:.2f}s"
    )


def test_adamw_step_peak_matches_known_sizes_and_analytic(adamw_b4):
    r, s = adamw_b4
    print(_fmt(r, s))
    assert r.method.startswith("cpu:")
    assert set(r.by_category) == set(CATEGORY_KEYS)
    assert sum(r.by_category.values()) == r.peak_bytes

    # The peak is absolute: it contains weights + optimizer state that pre-existed the step,
    # each counted exactly once (they appear once as PREEXISTING in the timeline).
    assert r.peak_bytes >= s["params"] + s["grads"] + s["optimizer"]
    assert r.by_category["weights"] == pytest.approx(s["params"], rel=0.01)
    assert r.by_category["optimizer"] == pytest.approx(s["optimizer"], rel=0.01)
    assert r.preexisting_bytes >= s["params"] + s["optimizer"]
    assert r.preexisting_bytes <= s["params"] + s["optimizer"] + 4 * 4096  # + token batch
    # Independent allocator-level cross-check of the net-new peak.
    assert r.allocator_net_peak_bytes == r.net_peak_bytes
    # Everything the step allocated was released (zero_grad(set_to_none=True)).
    assert r.end_bytes == r.preexisting_bytes
    # All gradients were alive at some point (end of backward).
    assert r.category_max["grads"] == pytest.approx(s["grads"], rel=0.01)

    # Activations: the profiler's max of the activation category (end of forward) vs. the
    # saved-for-backward formula; the measurement also holds non-saved forward outputs alive at
    # that moment (e.g. the logits held by the model output), measured ~+2% here -> 5%.
    assert r.category_max["activations"] == pytest.approx(s["activations"], rel=0.05)
    assert r.by_category["activations"] <= 1.02 * s["activations"]

    # Whole peak vs analytic.  Plain backward has two candidate peak moments: start of backward
    # (all activations, ~no grads) and end of backward / optimizer (all grads, no activations).
    # The analytic model omits the transient gradients w.r.t. activations that exist during
    # backward (profiler AUTOGRAD_DETAIL, in "other": ~10% of the peak for this tiny model), so
    # it is a lower bound that should sit within 15% of the measurement.
    candidates = [
        analytic_breakdown(
            param_bytes=s["params"],
            grad_bytes_at_peak=0,
            optimizer_bytes=s["optimizer"],
            activation_bytes=s["activations"],
        ),
        analytic_breakdown(
            param_bytes=s["params"],
            grad_bytes_at_peak=s["grads"],
            optimizer_bytes=s["optimizer"],
            activation_bytes=0,
        ),
    ]
    analytic = max(candidates, key=lambda d: d["total"])
    assert analytic["grads"] == 0  # activation-dominated configuration
    rel = (r.peak_bytes - analytic["total"]) / r.peak_bytes
    print(f"analytic={analytic} measured={r.peak_bytes} rel_diff={rel:+.3f}")
    assert 0.0 <= rel <= 0.15

    # Meter overhead on a ~1M-parameter model: a few seconds (generous bound: shared CI CPUs).
    assert 0.9e6 < s["n_params"] < 1.2e6
    assert r.elapsed_s + r.analysis_s < 30.0
    # RSS is a real, non-zero high-water mark.
    assert r.rss_peak_bytes and r.rss_peak_bytes > r.peak_bytes


def test_activations_scale_with_batch(adamw_b4, adamw_b8):
    r4, s4 = adamw_b4
    r8, s8 = adamw_b8
    print(_fmt(r4, s4))
    print(_fmt(r8, s8))
    assert r8.by_category["weights"] == r4.by_category["weights"]
    assert r8.by_category["optimizer"] == r4.by_category["optimizer"]
    ratio_peak = r8.by_category["activations"] / r4.by_category["activations"]
    ratio_max = r8.category_max["activations"] / r4.category_max["activations"]
    assert 1.8 < ratio_peak < 2.2
    assert 1.8 < ratio_max < 2.2
    assert r8.peak_bytes > r4.peak_bytes


def _backward_report(free_in_hook: bool):
    cfg = _config()
    m = _model(cfg)
    x = _tokens(1, 16)  # few tokens: gradients, not activations, dominate plain backward
    summary: dict[str, float] = {}
    handles = []
    if free_in_hook:
        for name, p in m.named_parameters():

            def hook(p, name=name):
                summary[name] = float(p.grad.float().norm())
                p.grad = None

            handles.append(p.register_post_accumulate_grad_hook(hook))

    def step():
        out = m(input_ids=x, labels=x)
        out.loss.backward()
        del out
        for name, p in m.named_parameters():
            if p.grad is not None:
                summary[name] = float(p.grad.float().norm())
        m.zero_grad(set_to_none=True)

    step()
    with MemoryMeter() as mm:
        step()
    for h in handles:
        h.remove()
    assert len(summary) == len(list(m.parameters()))
    return mm.report, m


def test_freeing_grads_in_hooks_lowers_grads_at_peak():
    plain, m = _backward_report(False)
    hooked, _ = _backward_report(True)
    gb = tensor_bytes(m.parameters())
    biggest = max(p.numel() * p.element_size() for p in m.parameters())
    print("plain", plain.by_category, plain.category_max, plain.peak_bytes)
    print("hooked", hooked.by_category, hooked.category_max, hooked.peak_bytes)
    # Plain backward: all grads coexist; in this grads-dominated setup they are all alive at peak.
    assert plain.category_max["grads"] == pytest.approx(gb, rel=0.01)
    assert plain.by_category["grads"] > 0.9 * gb
    # Hooks free each grad right after accumulation: at most a couple of grads ever coexist.
    assert hooked.category_max["grads"] <= 2 * biggest
    assert hooked.by_category["grads"] < 0.25 * plain.by_category["grads"]
    assert hooked.peak_bytes < plain.peak_bytes - 0.5 * gb


def test_cpu_phase_peaks_split_the_timeline_where_the_phases_end():
    """Each phase's peak is the largest live total between its end and the previous phase's;
    the region's peak is the largest phase peak."""
    mib = 2**20
    kept = torch.zeros(mib // 4)  # pre-existing, touched in the region
    with MemoryMeter("cpu") as mm:
        a = kept + 1  # phase "a": +1 MiB, kept
        mm.phase("a")
        b = torch.full((mib,), 2.0)  # phase "b": +4 MiB, freed before it ends
        del b
        mm.phase("b")
        c = a * 3  # phase "c": +1 MiB, kept
        mm.phase("c")
    peaks = mm.report.phase_peaks
    assert list(peaks) == ["a", "b", "c"]
    assert peaks["a"] == pytest.approx(2 * mib, rel=0.01)
    assert peaks["b"] == pytest.approx(6 * mib, rel=0.01)
    assert peaks["c"] == pytest.approx(3 * mib, rel=0.01)
    assert max(peaks.values()) == mm.report.peak_bytes
    del a, c


# ------------------------------------------------------------------------------------------------
# Robustness
# ------------------------------------------------------------------------------------------------


def test_exception_in_region_propagates_and_meter_is_reusable():
    with pytest.raises(ValueError):
        with MemoryMeter() as mm:
            torch.ones(10)
            raise ValueError("boom")
    assert mm.report is None
    with MemoryMeter() as mm2:  # profiler was stopped cleanly
        y = torch.ones(1000) * 2
    assert mm2.report is not None and mm2.report.peak_bytes >= 4000
    d = mm2.report.to_dict()
    assert d["peak_bytes"] == mm2.report.peak_bytes and "by_category" in d
    del y


def test_private_api_change_gives_clear_error(monkeypatch):
    import torch.profiler._memory_profiler as mp

    monkeypatch.delattr(mp, "MemoryProfile")
    with pytest.raises(MemoryProfilerAPIError, match="torch"):
        with MemoryMeter():
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_meter_uses_allocator_peak():  # pragma: no cover - no GPU in CI
    x = torch.zeros(1 << 20, device="cuda")
    with MemoryMeter("cuda") as mm:
        y = torch.ones(1 << 22, device="cuda")
        del y
    r = mm.report
    assert r.method.startswith("cuda:") and r.rss_peak_bytes is None and r.by_category == {}
    assert r.peak_bytes >= x.nbytes + (4 << 22)


@pytest.mark.e2e  # the whole benchmark script, in a process of its own
def test_gpu_check_runs_its_table_on_cpu():
    """benchmarks/gpu_check.py is run on GPUs only when one is lent; its code path (bf16
    compute in the sweep's step, the side-by-side table) runs here at a tiny size."""
    import subprocess
    import sys

    from conftest import ROOT
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--device", "cpu",
                          "--size", "tiny"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines() if line.split()]
    header = next(line for line in lines if line[0] == "method")
    rows = {line[0]: dict(zip(header, line)) for line in lines
            if line[0] in ("dense_adam", "galore", "logra")}
    assert set(rows) == {"dense_adam", "galore", "logra"}
    assert rows["dense_adam"]["peak_mem_bytes_vs_reference"] == "1.000"
    # LoGRA's sync payload is smaller than dense Adam's; the planner's error is printed
    assert float(rows["logra"]["sync_bytes_per_step_vs_reference"]) < 1.0
    assert abs(float(rows["logra"]["planned_error"])) < 0.5
    assert "bfloat16 compute" in out.stdout and "vLLM sync path: skipped" in out.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_activation_estimate_matches_saved_tensors_exactly(dtype):
    from logra.rl.loss import token_logprobs
    cfg = _config(num_hidden_layers=2, num_key_value_heads=2, head_dim=48)
    m = _model(cfg, "sdpa", dtype)
    B, T = 3, 40
    x = _tokens(B, T)
    am = torch.ones(B, T, dtype=torch.long)
    am[0, :5] = 0
    _, saved = saved_tensor_bytes(token_logprobs, m, x, am, 1.0, 16,
                                  exclude=list(m.parameters()) + [x])
    est = activation_bytes_estimate(cfg, B, T, dtype_bytes=torch.finfo(dtype).bits // 8,
                                    attn_implementation="sdpa", attention_mask=True,
                                    loss="chunked")
    assert est == saved


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_logra_activation_estimate_matches_saved_tensors_exactly(attn):
    """LoGRA freezes every weight: no projection saves its input, each keeps X·Aᵀ instead
    (`sketch_rank`). float32 (LoGRA stores float32 weights; bf16 compute under autocast saves
    the cast weights too, which the planner's bf16 policy, FSDP's, does not have)."""
    from logra.optim.logra_rule import LoGRA
    from logra.rl.loss import token_logprobs
    cfg = _config(num_hidden_layers=2, num_key_value_heads=2, head_dim=48)
    m = _model(cfg, attn)
    rule = LoGRA(m, rank=5)
    B, T = 3, 40
    x = _tokens(B, T)
    am = torch.ones(B, T, dtype=torch.long)
    am[0, :5] = 0
    _, saved = saved_tensor_bytes(token_logprobs, m, x, am, 1.0, 16,
                                  exclude=list(m.parameters()) + [x])
    est = activation_bytes_estimate(cfg, B, T, attn_implementation=attn, attention_mask=True,
                                    loss="chunked", sketch_rank=rule.rank)
    assert est == saved


@pytest.mark.parametrize("rule, options", [
    ("logra", {"rank": 4, "update_ratio": 3e-3, "probe_responses": 2}),  # Python hooks
    ("lora", {"lr": 1e-3, "rank": 2}),                                   # peft's modules
])
def test_labelled_weights_spare_the_python_tracer_and_keep_the_breakdown(rule, options):
    """The same update step measured twice from the same state: once with the model's
    parameters labelled "weights" (the profiler runs without its Python tracer, as the loop
    measures) and once without (the profiler finds them through module calls): the same peak
    and the same breakdown."""
    from transformers import AutoModelForCausalLM

    from logra import rules
    from logra.harness.memory_point import fixed_batch
    from logra.rl.models import tiny_config
    from logra.rl.step import update_step
    grpo = grpo_settings({"aggregation": "dapo", "temperature": 1.0, "clip_low": 0.2,
                          "clip_high": 0.28, "probe_size": 4, "micro_batch_size": 4,
                          "estimator": "grpo"})
    reports = []
    for label_weights in (True, False):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4))
        update = rules.build(rule, model, options)
        batch, probe = fixed_batch(model.config.vocab_size, 8, 6, 6, 4)
        update_step(model, None, update, None, batch, probe, grpo)  # the rule's state exists
        labels = {"optimizer": update.state_tensors(), "grads": update.grad_buffers()}
        if label_weights:
            labels["weights"] = list(model.parameters())
        meter = MemoryMeter("cpu", labels=labels)
        assert meter._with_stack is not label_weights
        with meter:
            update_step(model, None, update, None, batch, probe, grpo)
        reports.append(meter.report)
    fast, traced = reports
    assert fast.peak_bytes == traced.peak_bytes
    assert fast.by_category == traced.by_category, (fast.by_category, traced.by_category)
