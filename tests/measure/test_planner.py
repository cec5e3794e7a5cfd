"""The memory planner: its formulas against the rules' own tensors, and against a measured step."""
import dataclasses

import pytest
import torch
from conftest import ROOT
from transformers import AutoConfig

from logra import rules
from logra.common import PHASES
from logra.harness.config import grpo_settings
from logra.harness.memory_point import measure
from logra.measure.activations import activation_breakdown
from logra.measure.memory import MemoryMeter
from logra.measure.planner import (authors_probe_transient, mean_over_updates, plan, predict,
                                   sync_bytes, sync_columns)
from logra.rl.models import load
from logra.rl.weight_sync import payload_bytes

RULES = [("dense_adam", {}), ("logra", {"rank": 4, "probe_responses": 2}),
         ("logra", {"rank": 4, "controller": False, "refresh": False}),
         ("sketch_adam", {"rank": 4}), ("galore", {"rank": 4}), ("lora", {"rank": 4}),
         ("lora", {"rank": 1, "dense_modules": "embed_tokens|lm_head|norm"}),
         ("apollo", {"rank": 4, "update_proj_gap": 2}),
         ("apollo", {"rank": 1, "scale_type": "tensor", "scale": 128}), ("adam_mini", {}),
         ("adamw_8bit", {}), ("muon", {})]
# a config's grpo section that sets these keys (the schema's defaults for the rest)
GRPO = dataclasses.asdict(grpo_settings({"temperature": 1.0, "aggregation": "dapo",
                                         "clip_low": 0.2, "clip_high": 0.28, "beta": 0.0,
                                         "probe_size": 4, "estimator": "grpo"}))


@pytest.mark.parametrize("rule, options", RULES)
def test_planned_state_grads_and_sync_equal_the_rules_tensors(tiny_dir, rule, options):
    model, tok = load(tiny_dir)
    r = rules.build(rule, model, options)
    ids = tok(["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"], return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    r.apply(r.propose(), 1.0)  # LoGRA and GaLore allocate bases / projections on the first step
    planned = plan(model.config, rule, options, micro_batch=2, seq_len=12)
    assert planned["optimizer"] == r.state_bytes()
    assert planned["grads"] == r.peak_grad_bytes()
    payload = r.sync_payload()
    sent = payload_bytes({k: v for k, v in payload.items() if k != "lowrank"}) + sum(
        x["coef"].numel() * x["coef"].element_size() for x in payload.get("lowrank", {}).values())
    basis = sum(x["basis"].numel() * 4 for x in payload.get("lowrank", {}).values()
                if x.get("basis") is not None)
    if rule == "sketch_adam":  # its basis is sent on refresh only: planned amortized over 50
        assert sync_bytes(model.config, rule, options) == sent + basis // 50
    else:  # LoGRA: the factors; the engine draws each projection from its seed
        assert basis == 0 and sync_bytes(model.config, rule, options) == sent


def test_sharding_and_policy_and_a_known_parameter_count():
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-32b.json")
    one = plan(qwen, "dense_adam", micro_batch=1, seq_len=128, policy="bf16")
    eight = plan(qwen, "dense_adam", micro_batch=1, seq_len=128, policy="bf16", gpus=8,
                 sharding="fsdp")
    assert one["weights"] == 2 * 32_763_876_352  # Qwen2.5-32B, bf16
    assert one["master"] == one["grads"] == 2 * one["weights"]
    for key in ("weights", "master", "grads", "optimizer"):
        assert eight[key] == one[key] // 8
    assert eight["activations"] == one["activations"] and eight["fsdp"] > 0 == one["fsdp"]
    with pytest.raises(ValueError, match="policy: unknown 'fp16'"):
        plan(qwen, "dense_adam", micro_batch=1, seq_len=8, policy="fp16")
    with pytest.raises(ValueError, match="rollout_share needs gpu_bytes"):
        plan(qwen, "dense_adam", micro_batch=1, seq_len=8, rollout_share=0.3)


def test_a_point_planned_past_the_available_memory_is_an_oom_without_allocating(monkeypatch):
    """A vocabulary of 10^9 (a 256 GB embedding at hidden size 64): the planner's bytes exceed
    what the machine has, so the point records an oom with them as what it needed, a
    prediction, and allocates nothing; one that fits is measured as before."""
    from logra.harness import memory_point
    size = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2}
    shape = {"batch": 4, "micro_batch": 2, "prompt_len": 4, "completion_len": 4}
    room = memory_point.available_bytes(torch.device("cpu"))
    assert 0 < room < 2**50
    built = []
    monkeypatch.setattr(memory_point, "n_params", lambda m: built.append(m) or 123)
    point = measure(size | {"vocab_size": 10**9}, {"rule": "dense_adam", "options": {}}, shape,
                    GRPO, steps=3)
    assert point["status"] == "oom" and point["peak_mem_bytes"] is None
    assert point["oom_needed_bytes"] == point["planned"]["total"] > 10 * room
    assert "(a prediction)" in point["oom_check"] and "bytes available on cpu" in point[
        "oom_check"]
    assert [p.device.type for p in built[0].parameters()][0] == "meta"  # counted, not allocated
    assert measure(size, {"rule": "dense_adam", "options": {}}, shape, GRPO,
                   steps=3)["status"] == "ok"


@pytest.mark.parametrize("rule, options", RULES)
def test_planned_total_within_10_percent_of_a_measured_step(rule, options):
    size = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    shape = {"batch": 8, "micro_batch": 4, "prompt_len": 8, "completion_len": 8}
    torch.set_num_threads(1)
    point = measure(size, {"rule": rule, "options": options}, shape, GRPO, steps=3)
    assert point["status"] == "ok"
    assert abs(point["planned_error"]) <= 0.10, point["planned"]
    assert point["optimizer_state_bytes"] == point["planned"]["optimizer"]


@pytest.mark.parametrize("rule, options", RULES)
def test_planner_predicts_each_measured_phase_where_the_vocabulary_dominates(rule, options):
    """With a vocabulary of 16k the output layer, the loss's logits and the KL probe dominate:
    every phase's prediction is within 10% of the phase's measured peak, the total is the
    largest phase and names it."""
    size = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 16384}
    shape = {"batch": 8, "micro_batch": 4, "prompt_len": 8, "completion_len": 8}
    kl = {"target": 1e-3} if rule in ("dense_adam", "sketch_adam") else None
    torch.set_num_threads(1)
    point = measure(size, {"rule": rule, "options": options, "kl_control": kl}, shape, GRPO,
                    steps=3)
    planned, measured = point["planned"], point["phase_peaks"]
    phases = [p for p in PHASES if f"phase_{p}" in planned]
    own = rule == "logra" and options.get("controller", True)  # LoGRA's own controller
    assert ("kl_control" in phases) == (kl is not None or own)
    assert planned["total"] == max(planned[f"phase_{p}"] for p in phases)
    assert planned["total"] == planned[f"phase_{planned['peak_phase']}"]
    for phase in phases:
        if phase == "rollout":  # not measured on CPU (the engine is another process)
            continue
        assert planned[f"phase_{phase}"] == pytest.approx(measured[phase], rel=0.10), phase


@pytest.mark.parametrize("rule, options", [("dense_adam", {}),
                                           ("logra", {"rank": 4, "probe_responses": 2})])
def test_planned_total_within_10_percent_under_bf16_compute(rule, options):
    """bf16 autocast on fp32 weights (the authors' precision): the planner, told the compute
    dtype, predicts the measured peak within 10% and names its phase."""
    size = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    shape = {"batch": 8, "micro_batch": 4, "prompt_len": 8, "completion_len": 8}
    torch.set_num_threads(1)
    point = measure(size, {"rule": rule, "options": options}, shape, GRPO, steps=3,
                    compute_dtype="bfloat16")
    assert abs(point["planned_error"]) <= 0.10, point["planned"]
    assert point["planned"]["peak_phase"] == point["peak_phase"]


def test_bf16_weights_with_8bit_states_planned_as_built_and_measured(tiny_dir):
    """Weights stored in bf16 with 8-bit AdamW and stochastic rounding (grpo.param_dtype
    bfloat16): no float32 copy and bf16 gradients; the planned state and gradient bytes equal
    the rule's, and the planned total is within 10% of a measured step's peak, which is below
    half of dense Adam's on float32 weights at the same point."""
    options = {"bf16_stochastic_round": True}
    model, tok = load(tiny_dir, dtype=torch.bfloat16)
    r = rules.build("adamw_8bit", model, options)
    ids = tok(["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"], return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert {g.dtype for g in grads} == {torch.bfloat16}
    r.apply(r.propose(), 1.0)
    planned = plan(model.config, "adamw_8bit", options, micro_batch=2, seq_len=12,
                   policy="bf16")
    assert planned["optimizer"] == r.state_bytes() and planned["master"] == 0
    assert planned["grads"] == sum(g.nbytes for g in grads)
    size = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    shape = {"batch": 8, "micro_batch": 4, "prompt_len": 8, "completion_len": 8}
    torch.set_num_threads(1)
    pure = measure(size, {"rule": "adamw_8bit", "options": options}, shape,
                   GRPO | {"param_dtype": "bfloat16"}, steps=3)
    dense = measure(size, {"rule": "dense_adam", "options": {}}, shape, GRPO, steps=3)
    assert abs(pure["planned_error"]) <= 0.10, pure["planned"]
    assert pure["peak_mem_bytes"] < 0.5 * dense["peak_mem_bytes"]


def test_cpu_offload_moves_weights_gradients_and_state_to_the_host():
    """FSDP's CPU offload of dense AdamW on float32 shards with bf16 compute: the GPU holds none
    of weights, gradients, moments; the node's host holds all of them, 16 bytes per parameter;
    each micro-batch copies every GPU's weight shard in twice (forward and backward gathers)
    and its fp32 gradient shard out once; the rest of the GPU's plan is the plan without it."""
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-32b.json")
    n = 32_763_876_352
    setting = dict(micro_batch=1, seq_len=1024, policy="fp32", compute="bf16", gpus=8,
                   sharding="fsdp", checkpointing=True)
    kept, off = plan(qwen, "dense_adam", **setting), plan(qwen, "dense_adam", offload=True,
                                                           **setting)
    assert all(off[k] == 0 for k in ("weights", "master", "grads", "optimizer"))
    assert off["host"] == 16 * n == 8 * sum(kept[k] for k in ("weights", "master", "grads",
                                                               "optimizer"))
    assert off["pcie"] == 3 * 4 * n // 8 and off["pcie_probe"] == 2 * 4 * n // 8
    assert off["activations"] == kept["activations"] and off["fsdp"] > kept["fsdp"]
    assert off["total"] < kept["total"] - 0.9 * 16 * n / 8
    with pytest.raises(ValueError, match="offload: FSDP's CPU offload shards"):
        plan(qwen, "dense_adam", micro_batch=1, seq_len=8, offload=True)


def test_compute_dtype_probe_size_zero_and_the_authors_logits():
    """The compute dtype sizes what the forward forms, never the stored weights or the state;
    probe_size 0 plans no probe; logits="full" (every position's fp32 logits, a full
    log_softmax) adds 3 fp32 vocabulary-sized tensors per token to the forward/backward of
    every method, less the chunked loss's chunk and, under checkpointing, the recomputed layer
    the saved log_softmax displaces as the largest term."""
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-math-1.5b.json")
    setting = dict(micro_batch=1, seq_len=1024, gpus=4, sharding="fsdp", checkpointing=True,
                   probe_size=0, completion_len=768, chunk_tokens=256)
    for rule, options in (("dense_adam", {}), ("logra", {"rank": 256})):
        kl = rule == "logra"
        fp32 = plan(qwen, rule, options, kl_control=kl, **setting)
        bf16 = plan(qwen, rule, options, kl_control=kl, compute="bf16", **setting)
        for key in ("weights", "master", "grads", "optimizer"):
            assert bf16[key] == fp32[key], key
        assert bf16["activations"] < fp32["activations"] and bf16["fsdp"] < fp32["fsdp"]
        assert bf16["probe"] == fp32["probe"] == 0
        full = plan(qwen, rule, options, kl_control=kl, compute="bf16", logits="full",
                    **setting)
        grown = full["phase_forward_backward"] - bf16["phase_forward_backward"]
        layer = activation_breakdown(qwen, batch=1, seq_len=1024, dtype_bytes=2)["per_layer"]
        assert grown >= 3 * 1024 * qwen.vocab_size * 4 - 256 * qwen.vocab_size * 6 - layer
    with pytest.raises(ValueError, match="logits: unknown 'dense'"):
        plan(qwen, "dense_adam", micro_batch=1, seq_len=8, logits="dense")
    with pytest.raises(ValueError, match="compute: unknown 'fp16'"):
        plan(qwen, "dense_adam", micro_batch=1, seq_len=8, compute="fp16")


def _authors_probe(model, ids, directions):
    """LoGRA's JVP probe as its authors' code runs it (skzhang1/RL, nemo_rl/models/automodel/
    logra_probe.py `predict_batch_kl` and `factorized_direction`, logra.py `predicted_kl`), on
    one sequence: eval mode, eager attention, forward-mode AD with each target's output tangent
    added by a hook, bf16 autocast on bf16 weights (as FSDP's mixed precision gathers them),
    the logits cast to float32 (FSDP's output dtype), the float64 KL 64 positions at a time."""
    import torch.autograd.forward_ad as fwad

    def hook(projection, direction):
        def add(module, inputs, output):
            primal, tangent = fwad.unpack_dual(output)
            a = fwad.unpack_dual(inputs[0]).primal
            delta = -(a @ projection.to(a.dtype).T) @ direction.to(a.dtype).T
            return fwad.make_dual(primal, delta if tangent is None else tangent + delta)
        return add

    def kl(logits, tangent, temperature):  # the chunk's copies alive as arguments
        p = (logits.double() / temperature).softmax(-1)
        d = tangent.double() / temperature
        centered = d - (p * d).sum(-1, keepdim=True)
        return 0.5 * (p * centered.square()).sum(-1)

    handles = [m.register_forward_hook(hook(p, d)) for m, (p, d) in directions.items()]
    try:
        with torch.no_grad(), fwad.dual_level(), torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
            logits, tangent = fwad.unpack_dual(output.logits.float())
            del output
            for chunk in torch.arange(ids.shape[1] - 1).split(64):
                kl(logits[0, chunk], tangent[0, chunk], 1.0).sum().item()
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("heads, vocab, length", [(8, 256, 512), (2, 16384, 512),
                                                  (2, 16384, 1024)])
def test_the_authors_probe_term_is_the_live_bytes_of_their_probe(heads, vocab, length):
    """authors_probe_transient is within 5% of the live tensor bytes (the CPU allocator's, above
    the weights) of the authors' probe on a small Qwen2: where eager attention's scores
    dominate (8 heads, a 256-token vocabulary), where the float64 KL chunk does (16k, 512
    tokens) and where the logits' float32 cast does (16k, 1,024)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=2,
                         max_position_embeddings=length, tie_word_embeddings=True)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
    directions = {m: (torch.randn(4, m.in_features), 1e-3 * torch.randn(m.out_features, 4))
                  for n, m in model.named_modules() if n.endswith(("_proj"))}
    ids = torch.randint(0, vocab, (1, length))
    _authors_probe(model, ids, directions)  # warm-up
    with MemoryMeter("cpu") as meter:
        _authors_probe(model, ids, directions)
    predicted = authors_probe_transient(config, length, length - 1, 2)
    assert meter.report.net_peak_bytes == pytest.approx(predicted, rel=0.05)


def test_the_authors_probe_replaces_only_logras_jvp_pass():
    """probe="authors" moves LoGRA's kl_control phase only, by the authors' transient in place
    of this project's, and no other rule's plan; an unknown probe is named."""
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-math-7b.json")
    setting = dict(micro_batch=1, seq_len=4096, completion_len=3840, gpus=4, sharding="fsdp",
                   policy="fp32", compute="bf16", checkpointing=True, probe_size=0,
                   kl_control=True)
    ours = plan(qwen, "logra", {"rank": 256}, **setting)
    theirs = plan(qwen, "logra", {"rank": 256}, probe="authors", **setting)
    moved = {k for k in ours if ours[k] != theirs[k]} - {"total", "peak_phase"}
    assert moved == {"phase_kl_control"}
    from logra.measure.planner import _jvp_transient
    assert (theirs["phase_kl_control"] - authors_probe_transient(qwen, 4096, 3840, 2)
            == ours["phase_kl_control"] - _jvp_transient(qwen, 2, 4096, 3840, 256, 4, 2))
    assert plan(qwen, "dense_adam", probe="authors", **setting) == plan(qwen, "dense_adam",
                                                                        **setting)
    with pytest.raises(ValueError, match="probe: unknown 'vllm'"):
        plan(qwen, "logra", {"rank": 256}, probe="vllm", **setting)


def test_the_authors_statistic_is_the_mean_of_each_updates_own_peak():
    """mean_over_updates is the mean of `predict`'s total with each update at its own longest
    sequence (its completion the setting's prompt shorter) and its probe at its own length;
    at the setting's seq_len it is the one-update prediction, which bounds it from above. The
    probe's length alone moves only the probe's terms: shorter, LoGRA's JVP probe is smaller
    and dense Adam's plan does not change."""
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-math-1.5b.json")
    setting = dict(micro_batch=1, seq_len=4096, completion_len=3840, gpus=4, sharding="fsdp",
                   policy="fp32", compute="bf16", checkpointing=True, probe_size=0,
                   chunk_tokens=256)
    logra = {"rule": "logra", "options": {"rank": 256}}
    one = {n: predict(qwen, logra, setting | {"seq_len": n, "completion_len": n - 256}, GRPO)
           ["total"] for n in (1024, 4096)}
    assert mean_over_updates(qwen, logra, setting, GRPO, [1024, 4096]) == pytest.approx(
        (one[1024] + one[4096]) / 2)
    assert mean_over_updates(qwen, logra, setting, GRPO, [4096]) == one[4096] > one[1024]
    short = dict(setting, kl_control=True)
    del short["chunk_tokens"]
    long_probe = plan(qwen, "logra", {"rank": 256}, **short)
    assert plan(qwen, "logra", {"rank": 256}, probe_len=4096, **short) == long_probe
    short_probe = plan(qwen, "logra", {"rank": 256}, probe_len=1024, **short)
    assert short_probe["phase_kl_control"] < long_probe["phase_kl_control"]
    assert short_probe["activations"] == long_probe["activations"]
    assert plan(qwen, "dense_adam", probe_len=1024, **short) == plan(qwen, "dense_adam", **short)
    with pytest.raises(ValueError, match="probe_len: 200 leaves no completion after the "
                                         "prompt of 256 tokens"):
        plan(qwen, "logra", {"rank": 256}, probe_len=200, **short)


def test_fsdp_holds_the_root_group_and_the_port_trains_logras_non_targets_by_adamw():
    """Under FSDP every method holds the root group gathered (embeddings, final norm, output
    layer: counted from the config, in the compute dtype); the port's setting (non_target
    adamw) adds to LoGRA the AdamW gradients and two moments of every weight it leaves out,
    sharded, and the output layer's weight gradient; dense Adam, which trains them already,
    is planned as before."""
    from logra.measure.planner import geometry
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-math-7b.json")
    setting = dict(micro_batch=1, seq_len=1024, completion_len=768, gpus=4, policy="fp32",
                   compute="bf16", checkpointing=True, probe_size=0)
    root = qwen.vocab_size * qwen.hidden_size * (1 if qwen.tie_word_embeddings else 2) \
        + qwen.hidden_size
    geo, layer = geometry(qwen, {}, "dense_adam")
    assert geo.n_all == root + qwen.num_hidden_layers * layer
    for rule, options in (("dense_adam", {}), ("logra", {"rank": 256})):
        sharded = plan(qwen, rule, options, sharding="fsdp", **setting)
        frozen = rule == "logra"
        assert sharded["fsdp"] == (2 + (not frozen)) * layer * 2 + root * 2
        assert plan(qwen, rule, options, sharding="none", **setting)["fsdp"] == 0
    logra = plan(qwen, "logra", {"rank": 256}, sharding="fsdp", **setting)
    port = plan(qwen, "logra", {"rank": 256}, sharding="fsdp", non_target="adamw", **setting)
    rest = geometry(qwen, {}, "logra")[0]
    rest = rest.n_all - rest.n_low
    assert port["grads"] - logra["grads"] == rest * 4 // 4
    assert port["optimizer"] - logra["optimizer"] == 2 * rest * 4 // 4
    assert port["activations"] - logra["activations"] == qwen.vocab_size * qwen.hidden_size * 4
    dense = plan(qwen, "dense_adam", sharding="fsdp", **setting)
    assert plan(qwen, "dense_adam", sharding="fsdp", non_target="adamw", **setting) == dense
    with pytest.raises(ValueError, match="non_target: unknown 'sgd'"):
        plan(qwen, "logra", sharding="fsdp", non_target="sgd", **setting)


def test_a_memory_point_runs_its_updates_at_the_lengths_given():
    """measure(lengths=...): a warm-up, then each update at the next completion length
    (cycled); the measured step and the prediction at the first; without lengths, every
    update at the shape's completion length."""
    size = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2}
    shape = {"batch": 4, "micro_batch": 2, "prompt_len": 4, "completion_len": 4}
    method = {"rule": "dense_adam", "options": {}}
    point = measure(size, method, shape, GRPO, steps=5, lengths=[6, 3])
    assert point["update_seq_lens"] == [10, 10, 7, 10, 7] and point["seq_len"] == 10
    assert point["planned"] == measure(size, method, dict(shape, completion_len=6), GRPO,
                                       steps=3)["planned"]
    assert measure(size, method, shape, GRPO, steps=3)["update_seq_lens"] == [8, 8, 8]


def test_delta_prediction_is_the_formula_and_beats_full_below_a_third():
    """delta = changed fraction x trained words x (4 B int32 index + 2 B bf16 word); full = 2 B
    per trained word: delta is the smaller while the fraction is below 1/3."""
    qwen = AutoConfig.from_pretrained(ROOT / "config/models/qwen2.5-32b.json")
    words = 32_763_876_352  # Qwen2.5-32B, every weight trained by dense Adam
    full = sync_bytes(qwen, "dense_adam", policy="bf16", transport="full")
    assert full == sync_bytes(qwen, "dense_adam", policy="bf16") == 2 * words
    for fraction in (0.02, 0.3, 0.34):
        delta = sync_bytes(qwen, "dense_adam", policy="bf16", transport="delta",
                           changed_fraction=fraction)
        assert delta == round(fraction * words * 6)
        assert (delta < full) == (fraction < 1 / 3)
    assert sync_bytes(qwen, "dense_adam", policy="bf16", transport="low_rank") is None
    with pytest.raises(ValueError, match="changed_fraction"):
        sync_bytes(qwen, "dense_adam", policy="bf16", transport="delta")
    lora = {"rank": 4}  # its generic transports send the merged adapted weights only
    assert (sync_bytes(qwen, "lora", lora, "bf16", "full")
            == 2 * sync_columns(qwen, "lora", lora)["sync_trained_words"]
            < sync_bytes(qwen, "dense_adam", policy="bf16", transport="full"))
