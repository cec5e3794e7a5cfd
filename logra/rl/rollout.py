"""Rollout engines: generate G completions per prompt from a copy of the policy weights.

An engine owns its own copy of the weights, in its own process, exactly as vLLM does on GPUs:
the trainer never shares tensors with it and changes them only through sync payloads
(`logra/rl/weight_sync.py`). `HFRolloutEngine` runs Hugging Face `generate` in a spawned subprocess
and talks to it over a pipe; `VLLMRolloutEngine` runs vLLM on a GPU. Every engine offers
`generate`, `sync`, `state_dict` and `close`, and raises `EngineError` when the engine fails,
dies or does not answer in time: a call to the HF engine's process waits at most
max(`timeout_s`, `timeout_factor` x the longest earlier call of the same kind).

The interface's signatures and the time limit in full: docs/running.md, "Rollout engines".
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from logra.rl.weight_sync import apply_payload, deserialize, payload_to, serialize


class EngineError(RuntimeError):
    """The rollout engine failed, died or did not answer in time; the message says which."""


@dataclass
class Rollout:
    """One completion: token ids of the (unpadded) prompt and of the completion (ends with eos
    unless cut at max_new_tokens), the completion text without special tokens, and the
    engine's log-prob of each completion token under the distribution it was sampled from
    (logits / temperature, as `logra.rl.loss.token_logprobs` scores it; greedy: temperature 1)."""
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float]


def generate_rollouts(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
                      temperature: float, seed: int) -> list[Rollout]:
    """n completions per prompt (temperature 0 = greedy), grouped by prompt."""
    from transformers import GenerationConfig  # here: the config's checks import this module
    torch.manual_seed(seed)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    sample = temperature > 0
    # Sampling from the full softmax, so rollouts are samples of the policy the trainer scores.
    # transformers fills unset fields from the checkpoint's generation_config (hub models often
    # set top_k/top_p there), so they are switched off explicitly.
    config = GenerationConfig(do_sample=sample, temperature=temperature if sample else None,
                              top_k=0 if sample else None, top_p=1.0 if sample else None,
                              num_return_sequences=n, max_new_tokens=max_new_tokens,
                              pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=tokenizer.eos_token_id,
                              # each step's raw logits, kept: the log-probs need no extra pass
                              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)
    width = enc["input_ids"].shape[1]
    new = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1).float() / (temperature if sample else 1.0)
    logprobs = logits.gather(-1, new.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    rollouts = []
    for i, row in enumerate(new):
        prompt = enc["input_ids"][i // n][enc["attention_mask"][i // n].bool()].tolist()
        completion = row.tolist()
        if tokenizer.eos_token_id in completion:
            completion = completion[:completion.index(tokenizer.eos_token_id) + 1]
        rollouts.append(Rollout(prompt, completion,
                                tokenizer.decode(completion, skip_special_tokens=True),
                                logprobs[i, :len(completion)].tolist()))
    return rollouts


def _serve(conn, model_dir: str, dtype: str, threads: int) -> None:
    """Engine process: load the model, then answer requests until told to close."""
    from transformers import GenerationConfig

    from logra.rl.models import load
    torch.set_num_threads(threads)
    model, tokenizer = load(model_dir, dtype=getattr(torch, dtype))
    model.eval()
    # Sample from the policy itself: no processors from the checkpoint (repetition penalty,
    # min length, top-k/p) that the trainer's log-probs would not include.
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=tokenizer.eos_token_id)
    params = dict(model.named_parameters())
    bases: dict[str, torch.Tensor] = {}
    while True:
        op, args = _recv(conn)
        try:
            if op == "generate":
                _send(conn, ("ok", generate_rollouts(model, tokenizer, *args)))
            elif op == "sync":  # the serialized payload, as it crossed the pipe
                apply_payload(params, deserialize(args), bases)
                _send(conn, ("ok", None))
            elif op == "state_dict":
                _send(conn, ("ok", {k: v.detach() for k, v in params.items()}))
            elif op == "close":
                _send(conn, ("ok", None))
                return
        except Exception:  # report to the trainer instead of dying silently
            _send(conn, ("error", traceback.format_exc()))


# Plain pickle, not multiprocessing's: torch registers reducers there that pass tensors as
# shared-memory handles; a rollout engine must receive real bytes, as over a network.
def _send(conn: Connection, obj) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def _outcome(out: dict, fn, *args) -> None:
    """fn(*args) in a helper thread: its value, or the exception it raised, into `out`."""
    try:
        out["value"] = fn(*args)
    except BaseException as e:  # reported by the caller's thread
        out["error"] = e


class HFRolloutEngine:
    """Hugging Face `generate` in a separate process holding its own weights.

    The process is started with `python -m logra.rl.rollout` (not multiprocessing's spawn, which
    re-imports the caller's main script: a Snakemake script would run again) and talks over a
    multiprocessing pipe whose child end it inherits. Every call is sent and its reply read by
    helper threads (a large payload blocks on a full pipe, an engine stopped mid-reply blocks
    the read) while this one watches them, the process and the clock: see docs/running.md,
    "Rollout engines", for the time limit.
    """

    def __init__(self, model_dir: str, dtype: str = "float32", threads: int = 1,
                 timeout_s: float = 600.0, timeout_factor: float = 20.0):
        self._conn, child = mp.Pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "logra.rl.rollout", str(child.fileno()), str(model_dir), dtype,
             str(threads)], pass_fds=[child.fileno()])
        child.close()
        self.timeout_s, self.timeout_factor = timeout_s, timeout_factor
        self._longest: dict[str, float] = {}  # seconds of the longest call, by kind

    def _call(self, op: str, args=None):
        limit = max(self.timeout_s, self.timeout_factor * self._longest.get(op, 0.0))
        name = f"rollout engine hf (pid {self._proc.pid})"
        start = time.monotonic()
        sent, got = {}, {}  # each helper thread's outcome: a value or the exception it met
        sender = threading.Thread(target=_outcome, args=(sent, _send, self._conn, (op, args)),
                                  daemon=True)
        sender.start()
        receiver = threading.Thread(target=_outcome, args=(got, _recv, self._conn), daemon=True)
        receiver.start()
        while receiver.is_alive():  # the whole reply, or a dead engine, or the clock
            receiver.join(0.2)
            if "error" in sent and not isinstance(sent["error"], OSError):
                self._proc.kill()  # the request could not be sent (e.g. not picklable)
                self._proc.wait()
                raise EngineError(f"{name}: the {op!r} request failed") from sent["error"]
            if receiver.is_alive() and self._proc.poll() is not None:
                break
            if receiver.is_alive() and time.monotonic() - start > limit:
                self._proc.kill()
                self._proc.wait()
                raise EngineError(
                    f"{name} did not answer {op!r} within {limit:.0f} s (rollout.timeout_s "
                    f"{self.timeout_s:g}, or rollout.timeout_factor {self.timeout_factor:g} x "
                    f"its longest earlier {op!r}, {self._longest.get(op, 0.0):.2f} s); "
                    "it was killed")
        if "value" not in got:
            raise EngineError(f"{name} died during {op!r} (exit code {self._proc.poll()}); "
                              "see its stderr above") from got.get("error")
        sender.join()
        self._longest[op] = max(self._longest.get(op, 0.0), time.monotonic() - start)
        status, value = got["value"]
        if status == "error":
            raise EngineError(f"{name} failed on {op!r}:\n{value}")
        return value

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[Rollout]:
        """n completions per prompt, grouped: rollouts[i*n:(i+1)*n] belong to prompts[i]."""
        return self._call("generate", (prompts, n, max_new_tokens, temperature, seed))

    def sync(self, payload: dict) -> int:
        """Send a payload serialized (`logra.rl.weight_sync.serialize`) over the pipe; returns the
        serialized length, once the engine has applied it."""
        data = serialize(payload)
        self._call("sync", data)
        return len(data)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._call("state_dict")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._call("close")
                self._proc.wait(timeout=30)
            except (EngineError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class VLLMRolloutEngine:
    """vLLM on the GPU (`rollout.engine: vllm`), behind the same interface. Written against
    vLLM 0.32.0 (V1 engine) and checked against its source:

    - `vllm.LLM(model, dtype=, seed=, gpu_memory_utilization=, enable_prefix_caching=,
      worker_extension_cls=)` (`vllm/entrypoints/llm.py`, `LLM.__init__`; the last two reach
      `EngineArgs` through **kwargs). `worker_extension_cls` is a dotted name:
      `vllm.v1.worker.worker_base.WorkerWrapperBase.init_worker` imports it in the engine-core
      process and appends it to the bases of `vllm.v1.worker.gpu_worker.Worker`.
    - `LLM.collective_rpc(method, timeout=None, args=(), kwargs=None) -> list`, one result per
      worker; a method name is looked up with getattr on the worker
      (`vllm.v1.serial_utils.run_method`), so the extension's methods are found. Arguments and
      results cross to the engine-core process as msgpack (`vllm.v1.serial_utils.MsgpackEncoder`
      / `MsgpackDecoder`); utility-call arguments are decoded without types, so a tensor inside
      a dict arrives as a `[dtype, shape, buffer]` list, with or without
      VLLM_ALLOW_INSECURE_SERIALIZATION. Payloads (`logra.rl.weight_sync.serialize`) and weights
      (pickled) therefore travel as bytes, which msgpack carries as they are (no environment
      variable needed); like the HF engine's pipe, the engine receives real bytes.
    - `LLM.reset_prefix_cache() -> bool` (False when running requests hold KV blocks), after
      every sync: cached KV blocks were computed with the old weights.
    - `LLM.generate(prompts, sampling_params, use_tqdm=False) -> list[RequestOutput]` with one
      `vllm.SamplingParams(n=, temperature=, max_tokens=, seed=, logprobs=0)` per prompt;
      explicit params are not merged with the checkpoint's generation_config
      (`LLM.get_default_sampling_params` is used only for None). `RequestOutput.prompt_token_ids`,
      `.outputs`; `CompletionOutput.token_ids` (ends with eos when it stopped there,
      `vllm.v1.core.sched.utils.check_stop`), `.text` and `.logprobs`, one {token id: Logprob}
      per token holding the sampled token (`logprobs=0`: no others; `Logprob.logprob`).
    - `logprobs_mode="processed_logprobs"` (an `EngineArgs` / `ModelConfig` field reaching
      `LLM` through **kwargs): log-probs after temperature, as the sampler draws and the
      trainer scores (the default `raw_logprobs` is before temperature,
      `vllm.v1.sample.sampler.Sampler`). Not run here: checked against vLLM's documentation.

    Sync payloads are applied in place by `VLLMSyncExtension` with
    `logra.rl.weight_sync.apply_payload`, the code the HF engine and the tests here use, on views of
    vLLM's own parameters: dense tensors are copied and low-rank steps added (W += lift(C)) where
    they live; nothing else is loaded (a bf16 copy is updated with stochastic rounding, see
    `logra.optim.sketch.lift_add_`).

    Time limits: a sync waits at most `timeout_s` (collective_rpc's own timeout); generation
    runs inside vLLM's engine, whose own health checks stop a dead worker.

    vLLM does not run on CPU: the import is lazy, and selecting this engine without a CUDA
    device or without vllm installed raises an error that says so. Tensor parallelism is not
    supported (each worker would hold a shard of every fused weight).
    """

    def __init__(self, model_dir: str, dtype: str = "bfloat16", threads: int = 1,
                 gpu_memory_utilization: float = 0.3, timeout_s: float = 600.0,
                 timeout_factor: float = 20.0):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine: vllm needs a CUDA GPU and none is visible; "
                               "use rollout.engine: hf on this machine")
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError("rollout.engine: vllm is selected but not installed "
                               "(pip install vllm on the GPU machines)") from e
        self._vllm = vllm
        self.timeout_s = timeout_s  # bounds each sync (collective_rpc's timeout)
        self.llm = vllm.LLM(model=model_dir, dtype=dtype, seed=0, enable_prefix_caching=True,
                            gpu_memory_utilization=gpu_memory_utilization,
                            logprobs_mode="processed_logprobs",
                            worker_extension_cls="logra.rl.rollout.VLLMSyncExtension")

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[Rollout]:
        # vLLM's own sampling defaults (top_p 1, no top_k), not the checkpoint's: samples of
        # the policy the trainer scores
        params = [self._vllm.SamplingParams(n=n, temperature=temperature,
                                            max_tokens=max_new_tokens, seed=seed + i,
                                            logprobs=0)  # the sampled token's only
                  for i in range(len(prompts))]  # one random stream per prompt
        rollouts = []
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        except Exception as e:  # vLLM's own failures (a dead worker), as this interface's
            raise EngineError(f"rollout engine vllm failed on 'generate': {e}") from e
        for out in outputs:
            for c in out.outputs:  # token_ids end with eos when generation stopped there
                logprobs = [step[t].logprob for t, step in zip(c.token_ids, c.logprobs)]
                rollouts.append(Rollout(list(out.prompt_token_ids), list(c.token_ids), c.text,
                                        logprobs))
        return rollouts

    def sync(self, payload: dict) -> int:
        data = serialize(payload)
        try:
            self.llm.collective_rpc("logra_apply_payload", timeout=self.timeout_s, args=(data,))
        except Exception as e:  # vLLM's TimeoutError, a dead worker
            raise EngineError(f"rollout engine vllm failed on 'sync' (rollout.timeout_s "
                              f"{self.timeout_s:g}): {e}") from e
        if not self.llm.reset_prefix_cache():
            raise EngineError("rollout engine vllm did not reset its prefix cache after a sync")
        return len(data)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return pickle.loads(self.llm.collective_rpc("logra_state_dict")[0])

    def close(self) -> None:
        del self.llm


class VLLMSyncExtension:
    """Mixed into vLLM 0.32.0's `vllm.v1.worker.gpu_worker.Worker` (see `VLLMRolloutEngine`);
    its methods are called through `LLM.collective_rpc` and take and return bytes (payloads
    as `logra.rl.weight_sync.serialize` writes them, weights pickled).

    Relies on, in vLLM 0.32.0:
    - `Worker.model_runner` (`gpu_worker.Worker._init_workspace_and_model_runner`): the V1
      `vllm.v1.worker.gpu_model_runner.GPUModelRunner` or the V2
      `vllm.v1.worker.gpu.model_runner.GPUModelRunner`; both have `get_model()` (the bare
      model, V1 unwraps its CUDA-graph wrapper) and `parallel_config.tensor_parallel_size`.
    - `vllm.model_executor.models.llama.LlamaForCausalLM` (Qwen2 is laid out alike):
      parameters `model.embed_tokens.weight`, `model.layers.N.self_attn.qkv_proj.weight`,
      `.o_proj.weight`, `.mlp.gate_up_proj.weight`, `.mlp.down_proj.weight`,
      `.input_layernorm.weight`, `.post_attention_layernorm.weight`, `model.norm.weight`,
      `lm_head.weight`; class attribute `packed_modules_mapping = {"qkv_proj": ["q_proj",
      "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}`. With
      `tie_word_embeddings`, `ParallelLMHead.tie_weights` makes lm_head share the embedding's
      Parameter, so named_parameters lists it once, as `model.embed_tokens.weight`, as HF does.
    - `vllm.model_executor.layers.linear`: `QKVParallelLinear` / `MergedColumnParallelLinear`
      stack their members by rows in that order, with row counts `output_sizes`.
    - `vllm.model_executor.layers.vocab_parallel_embedding.VocabParallelEmbedding` (and
      `ParallelLMHead`): rows padded to a multiple of 64; the first `org_vocab_size` are the
      checkpoint's (`weight_loader` zeroes the rest).
    - Unquantized weights keep their loaded layout on CUDA
      (`UnquantizedLinearMethod.process_weights_after_loading` only repacks on CPU/XPU). CUDA
      graphs and torch.compile read the parameters' storage, so in-place updates through
      these views are what they compute with; nothing is reallocated.
    """

    def logra_hf_views(self) -> dict[str, torch.Tensor]:
        """HF parameter name -> view of the tensor vLLM holds it in: fused q/k/v and gate/up
        split by rows, padded embedding rows cut off."""
        if not hasattr(self, "_logra_views"):
            if self.model_runner.parallel_config.tensor_parallel_size > 1:
                raise NotImplementedError("logra sync into vLLM: tensor_parallel_size > 1")
            model = self.model_runner.get_model()
            packed = model.packed_modules_mapping
            views = {}
            for name, p in model.named_parameters():
                path, _, leaf = name.rpartition(".")
                module = model.get_submodule(path)
                parent, _, fused = path.rpartition(".")
                if fused in packed:  # split raises unless output_sizes cover every row
                    for member, rows in zip(packed[fused], p.data.split(module.output_sizes)):
                        views[f"{parent}.{member}.{leaf}"] = rows
                elif hasattr(module, "org_vocab_size"):  # VocabParallelEmbedding, ParallelLMHead
                    views[name] = p.data[:module.org_vocab_size]
                else:
                    views[name] = p.data
            self._logra_views, self._logra_bases = views, {}
        return self._logra_views

    def logra_apply_payload(self, data: bytes) -> None:
        views = self.logra_hf_views()
        device = next(iter(views.values())).device
        apply_payload(views, payload_to(deserialize(data), device), self._logra_bases)

    def logra_state_dict(self) -> bytes:
        weights = {k: v.to("cpu", copy=True) for k, v in self.logra_hf_views().items()}
        return pickle.dumps(weights, protocol=pickle.HIGHEST_PROTOCOL)


ENGINES = {"hf": HFRolloutEngine, "vllm": VLLMRolloutEngine}


def make_engine(name: str, model_dir: str, **options):
    """Engine by config name (`rollout.engine`)."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine: unknown {name!r}; known: {sorted(ENGINES)}")
    return ENGINES[name](model_dir, **options)


if __name__ == "__main__":
    from logra.rl.rollout import _serve as serve
    fd, model_dir, dtype, threads = sys.argv[1:]
    serve(Connection(int(fd)), model_dir, dtype, int(threads))
    # told to close: the interpreter's teardown (about a second with torch loaded) would only
    # free memory the process gives back on exit anyway
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
