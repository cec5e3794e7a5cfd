"""The rollout engine runs in its own process and matches the trainer only through payloads."""
import time

import pytest
import torch

from logra.optim.dense_adam import DenseAdam
from logra.rl.models import load
from logra.rl.rollout import HFRolloutEngine
from logra.rl.weight_sync import apply_payload, payload_bytes, serialize, serialized_bytes


def test_sync_payload_reproduces_trainer_weights_in_engine_process(tiny_dir):
    model, tok = load(tiny_dir)
    rule = DenseAdam(model, lr=1e-2)
    with HFRolloutEngine(str(tiny_dir)) as engine:
        prompts = ["Q: 1+2\nA: ", "Q: 33+4\nA: "]
        before = engine.generate(prompts, 3, 6, 1.0, seed=0)
        assert len(before) == 6 and all(r.prompt_ids == tok(prompts[i // 3])["input_ids"]
                                        for i, r in enumerate(before))
        for _ in range(2):  # two real updates
            ids = tok(prompts, return_tensors="pt", padding=True)
            model(**ids, labels=ids["input_ids"]).loss.backward()
            rule.apply(rule.propose(), 1.0)
            payload = rule.sync_payload()
            sent = engine.sync(payload)
        assert sent == serialized_bytes(payload)  # what crossed the pipe
        assert payload_bytes(payload) == sum(p.numel() * 4 for p in model.parameters())
        remote = engine.state_dict()
        for name, p in model.named_parameters():
            assert torch.equal(remote[name], p.detach()), name
        # the engine's sampling now follows the updated weights: same seed, different draws
        after = engine.generate(prompts, 3, 6, 1.0, seed=0)
        assert [r.completion_ids for r in after] != [r.completion_ids for r in before]


def test_engine_reports_errors_instead_of_hanging(tiny_dir):
    with HFRolloutEngine(str(tiny_dir)) as engine:
        try:
            engine.sync({"dense": {"no.such.weight": torch.zeros(1)}})
        except RuntimeError as e:
            assert "no.such.weight" in str(e)
        else:
            raise AssertionError("bad payload was accepted")


def test_a_request_that_cannot_be_sent_is_an_engine_error_not_a_hang(tiny_dir):
    """The sender thread's failure (here: a request that cannot be pickled) is raised at once
    as an EngineError, not waited out until the timeout."""
    from logra.rl.rollout import EngineError
    with HFRolloutEngine(str(tiny_dir), timeout_s=600) as engine:
        start = time.monotonic()
        with pytest.raises(EngineError, match="the 'generate' request failed"):
            engine._call("generate", lambda: None)
        assert time.monotonic() - start < 60


def test_lowrank_payload_applies_lift_on_the_right_side():
    w = {"a": torch.zeros(6, 4), "b": torch.zeros(6, 4)}
    q_left, c_left = torch.randn(6, 2), torch.randn(2, 4)
    q_right, c_right = torch.randn(4, 2), torch.randn(6, 2)
    bases = {}
    payload = {"lowrank": {"a": {"side": "left", "basis": q_left, "coef": c_left},
                           "b": {"side": "right", "basis": q_right, "coef": c_right}}}
    apply_payload(w, payload, bases)
    assert torch.allclose(w["a"], q_left @ c_left) and torch.allclose(w["b"], c_right @ q_right.T)
    assert payload_bytes(payload) == 4 * (12 + 8 + 8 + 12)
    apply_payload(w, {"lowrank": {"a": {"side": "left", "basis": None, "coef": c_left}}}, bases)
    assert torch.allclose(w["a"], 2 * q_left @ c_left)  # cached basis reused


def test_vllm_engine_without_gpu_or_vllm_says_so(tiny_dir):
    from logra.rl.engines import make_engine
    with pytest.raises(RuntimeError, match=r"vllm is selected \(rollout.engine or eval.backend"
                                           r"\) but not installed"):
        make_engine("vllm", str(tiny_dir))


def _vllm_llama(hf_params: dict[str, torch.Tensor], vocab_size: int) -> torch.nn.Module:
    """A stand-in for vLLM 0.32.0's `LlamaForCausalLM` holding the HF weights as vLLM loads
    them: same parameter names and `packed_modules_mapping`; q/k/v and gate/up stacked by rows
    in a module with `output_sizes` (`QKVParallelLinear`, `MergedColumnParallelLinear`);
    embedding and lm_head rows padded with zeros to a multiple of 64, the first
    `org_vocab_size` the checkpoint's (`VocabParallelEmbedding`)."""
    model = torch.nn.Module()
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                    "gate_up_proj": ["gate_proj", "up_proj"]}
    members = {m: (f, ms) for f, ms in model.packed_modules_mapping.items() for m in ms}

    def module_at(path: str) -> torch.nn.Module:
        module = model
        for part in path.split("."):
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        return module

    for name, w in hf_params.items():
        path, _, leaf = name.rpartition(".")
        parent, _, short = path.rpartition(".")
        if short in members:
            fused, group = members[short]
            if short == group[0]:
                rows = [hf_params[f"{parent}.{m}.{leaf}"] for m in group]
                module = module_at(f"{parent}.{fused}")
                module.output_sizes = [r.shape[0] for r in rows]
                module.register_parameter(leaf, torch.nn.Parameter(torch.cat(rows), False))
        elif short in ("embed_tokens", "lm_head"):
            module = module_at(path)
            module.org_vocab_size = vocab_size
            padded = torch.zeros(-(-vocab_size // 64) * 64, *w.shape[1:])
            padded[:vocab_size] = w
            module.register_parameter(leaf, torch.nn.Parameter(padded, False))
        else:
            module_at(path).register_parameter(leaf, torch.nn.Parameter(w.clone(), False))
    return model


def test_vllm_worker_extension_applies_payloads_into_fused_weights(tiny_dir):
    """The in-place sync path, a GPU worker's, which does not run on this CPU (there vLLM runs,
    and the reload path: tests/rl/test_vllm.py). A GPU worker holds q/k/v and gate/up fused by
    rows and the embeddings padded (`_vllm_llama`); the extension's views must put every HF
    weight where it lives there, so the weights equal the HF engine's after a dense and a
    low-rank sync. The stand-in worker has vLLM 0.32.0's attribute chain (`Worker.device`,
    `.model_runner.get_model()`, `.model_config`, `.parallel_config`) and receives what
    `collective_rpc` carries: serialized bytes."""
    import pickle
    from types import SimpleNamespace

    from logra.rl.vllm_engine import VLLMSyncExtension
    hf, _ = load(tiny_dir)
    hf_params = {n: p.detach().clone() for n, p in hf.named_parameters()}
    model = _vllm_llama(hf_params, hf.config.vocab_size)
    named = dict(model.named_parameters())
    assert "model.layers.0.self_attn.qkv_proj.weight" in named
    assert "model.layers.1.mlp.gate_up_proj.weight" in named
    assert named["model.embed_tokens.weight"].shape[0] > hf.config.vocab_size  # padded

    class Worker(VLLMSyncExtension):  # vllm.v1.worker.gpu_worker.Worker with the extension
        device = torch.device("cuda", 0)  # its weights stay on the CPU here
        model_runner = SimpleNamespace(get_model=lambda: model,
                                       model_config=SimpleNamespace(dtype=torch.float32),
                                       parallel_config=SimpleNamespace(tensor_parallel_size=1))
    worker = Worker()

    gen = torch.Generator().manual_seed(0)
    q_name, up_name = "model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"
    dense = {n: torch.randn(w.shape, generator=gen) for n, w in hf_params.items()
             if n.endswith(("v_proj.weight", "embed_tokens.weight"))}
    q = torch.linalg.qr(torch.randn(hf_params[up_name].shape[1], 2, generator=gen)).Q
    lowrank = {q_name: {"side": "left", "coef": torch.randn(2, hf_params[q_name].shape[1],
                                                            generator=gen),
                        "basis": torch.linalg.qr(torch.randn(hf_params[q_name].shape[0], 2,
                                                             generator=gen)).Q},
               up_name: {"side": "right", "basis": q,
                         "coef": torch.randn(hf_params[up_name].shape[0], 2, generator=gen)}}
    payload = {"dense": dense, "lowrank": lowrank}
    worker.logra_apply_payload(serialize(payload))
    apply_payload(hf_params, payload, {})  # the HF engine's path
    got = pickle.loads(worker.logra_state_dict())
    assert got.keys() == hf_params.keys()
    for n in hf_params:
        assert torch.equal(got[n], hf_params[n]), n
    # the views are the fused tensors' rows: nothing was copied out; the padding is untouched
    assert worker.logra_sync_path() == {"path": "in_place", "host_copy_bytes": 0}
    assert named["model.layers.0.self_attn.qkv_proj.weight"].data_ptr() == \
        worker._logra_views["model.layers.0.self_attn.q_proj.weight"].data_ptr()
    assert not named["model.embed_tokens.weight"][hf.config.vocab_size:].any()
