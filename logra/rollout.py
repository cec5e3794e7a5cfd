"""Rollout engines: generate G completions per prompt from a copy of the policy weights.

An engine owns its own copy of the weights, in its own process, exactly as vLLM does on GPUs:
the trainer never shares tensors with it and changes them only through sync payloads
(`logra/sync.py`). `HFRolloutEngine` runs Hugging Face `generate` in a spawned subprocess and
talks to it over a pipe; `VLLMRolloutEngine` runs vLLM on a GPU. Every engine offers

    generate(prompts, n, max_new_tokens, temperature, seed) -> list[Rollout]
    sync(payload) -> bytes sent
    state_dict() -> the engine's weights (for tests and drift checks)
    close()
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from logra.sync import apply_payload, payload_bytes, payload_to


@dataclass
class Rollout:
    """One completion: token ids of the (unpadded) prompt and of the completion (ends with eos
    unless cut at max_new_tokens), and the completion text without special tokens."""
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str


def generate_rollouts(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int,
                      temperature: float, seed: int) -> list[Rollout]:
    """n completions per prompt (temperature 0 = greedy), grouped by prompt."""
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
                              eos_token_id=tokenizer.eos_token_id)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)
    width = enc["input_ids"].shape[1]
    rollouts = []
    for i, row in enumerate(out):
        prompt = enc["input_ids"][i // n][enc["attention_mask"][i // n].bool()].tolist()
        completion = row[width:].tolist()
        if tokenizer.eos_token_id in completion:
            completion = completion[:completion.index(tokenizer.eos_token_id) + 1]
        rollouts.append(Rollout(prompt, completion,
                                tokenizer.decode(completion, skip_special_tokens=True)))
    return rollouts


def _serve(conn, model_dir: str, dtype: str, threads: int) -> None:
    """Engine process: load the model, then answer requests until told to close."""
    from logra.modeling import load
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
            elif op == "sync":
                apply_payload(params, args, bases)
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


class HFRolloutEngine:
    """Hugging Face `generate` in a separate process holding its own weights.

    The process is started with `python -m logra.rollout` (not multiprocessing's spawn, which
    re-imports the caller's main script: a Snakemake script would run again) and talks over a
    multiprocessing pipe whose child end it inherits.
    """

    def __init__(self, model_dir: str, dtype: str = "float32", threads: int = 1):
        self._conn, child = mp.Pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "logra.rollout", str(child.fileno()), str(model_dir), dtype,
             str(threads)], pass_fds=[child.fileno()])
        child.close()

    def _call(self, op: str, args=None):
        try:
            _send(self._conn, (op, args))
            status, value = _recv(self._conn)
        except (EOFError, OSError) as e:
            raise RuntimeError(f"rollout engine process died during {op} "
                               f"(exit code {self._proc.poll()}); see its stderr above") from e
        if status == "error":
            raise RuntimeError(f"rollout engine failed on {op}:\n{value}")
        return value

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[Rollout]:
        """n completions per prompt, grouped: rollouts[i*n:(i+1)*n] belong to prompts[i]."""
        return self._call("generate", (prompts, n, max_new_tokens, temperature, seed))

    def sync(self, payload: dict) -> int:
        """Send a payload; returns its size in bytes."""
        self._call("sync", payload)
        return payload_bytes(payload)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._call("state_dict")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._call("close")
                self._proc.wait(timeout=30)
            except (OSError, EOFError, subprocess.TimeoutExpired):
                self._proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class VLLMRolloutEngine:
    """vLLM on the GPU (`rollout.engine: vllm`), behind the same interface.

    Sync payloads reach every vLLM worker through `collective_rpc` and are applied in place
    by `VLLMSyncExtension`, a worker extension, with `logra.sync.apply_payload`: the code the
    HF engine and the tests here use. The extension gives that function each HF weight as a
    view into vLLM's parameters (q/k/v rows of the fused qkv_proj, gate/up rows of
    gate_up_proj), so dense tensors are copied and low-rank steps added (W += lift(C)) where
    they live; nothing else is loaded (a bf16 copy is updated with stochastic rounding, see
    `logra.sketch.lift_add_`). The prefix cache is reset after every sync: cached KV
    blocks were computed with the old weights.

    vLLM does not run on CPU: the import is lazy, and selecting this engine without a CUDA
    device or without vllm installed raises an error that says so. Tensor parallelism is not
    supported (each worker would hold a shard of every fused weight).
    """

    def __init__(self, model_dir: str, dtype: str = "bfloat16", threads: int = 1,
                 gpu_memory_utilization: float = 0.3):
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.engine: vllm needs a CUDA GPU and none is visible; "
                               "use rollout.engine: hf on this machine")
        try:
            import vllm
        except ImportError as e:
            raise RuntimeError("rollout.engine: vllm is selected but not installed "
                               "(pip install vllm on the GPU machines)") from e
        self._vllm = vllm
        self.llm = vllm.LLM(model=model_dir, dtype=dtype, seed=0, enable_prefix_caching=True,
                            gpu_memory_utilization=gpu_memory_utilization,
                            worker_extension_cls="logra.rollout.VLLMSyncExtension")

    def generate(self, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[Rollout]:
        # vLLM's own sampling defaults (top_p 1, no top_k), not the checkpoint's: samples of
        # the policy the trainer scores
        params = [self._vllm.SamplingParams(n=n, temperature=temperature,
                                            max_tokens=max_new_tokens, seed=seed + i)
                  for i in range(len(prompts))]  # one random stream per prompt
        rollouts = []
        for out in self.llm.generate(prompts, params, use_tqdm=False):
            for c in out.outputs:  # token_ids end with eos when generation stopped there
                rollouts.append(Rollout(list(out.prompt_token_ids), list(c.token_ids), c.text))
        return rollouts

    def sync(self, payload: dict) -> int:
        self.llm.collective_rpc("logra_apply_payload", args=(payload_to(payload, "cpu"),))
        self.llm.reset_prefix_cache()
        return payload_bytes(payload)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.llm.collective_rpc("logra_state_dict")[0]

    def close(self) -> None:
        del self.llm


class VLLMSyncExtension:
    """Mixed into vLLM's GPU worker (`LLM(worker_extension_cls=...)`); methods are called
    through `collective_rpc`. `self.model_runner` is the worker's."""

    def logra_hf_views(self) -> dict[str, torch.Tensor]:
        """HF parameter name -> view of the tensor vLLM holds it in. Fused modules
        (`packed_modules_mapping`, e.g. qkv_proj: [q_proj, k_proj, v_proj]) are split by rows
        in that order, with sizes from the HF config."""
        if not hasattr(self, "_logra_views"):
            model = self.model_runner.get_model()
            if self.model_runner.parallel_config.tensor_parallel_size > 1:
                raise NotImplementedError("logra sync into vLLM: tensor_parallel_size > 1")
            cfg = self.model_runner.model_config.hf_config
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            rows = {"q_proj": cfg.num_attention_heads * head_dim,
                    "k_proj": cfg.num_key_value_heads * head_dim,
                    "v_proj": cfg.num_key_value_heads * head_dim,
                    "gate_proj": cfg.intermediate_size, "up_proj": cfg.intermediate_size}
            packed = getattr(model, "packed_modules_mapping", {})
            views = {}
            for name, p in model.named_parameters():
                module = name.split(".")[-2] if "." in name else ""
                if module in packed:
                    offset = 0
                    for member in packed[module]:
                        views[name.replace(module, member)] = p.data[offset:offset + rows[member]]
                        offset += rows[member]
                    if offset != p.shape[0]:
                        raise ValueError(f"{name}: fused rows {p.shape[0]} != {offset}")
                else:
                    views[name] = p.data
            self._logra_views, self._logra_bases = views, {}
        return self._logra_views

    def logra_apply_payload(self, payload: dict) -> None:
        device = next(self.model_runner.get_model().parameters()).device
        views = self.logra_hf_views()
        apply_payload(views, payload_to(payload, device), self._logra_bases)

    def logra_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.logra_hf_views().items()}


ENGINES = {"hf": HFRolloutEngine, "vllm": VLLMRolloutEngine}


def make_engine(name: str, model_dir: str, **options):
    """Engine by config name (`rollout.engine`)."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine: unknown {name!r}; known: {sorted(ENGINES)}")
    return ENGINES[name](model_dir, **options)


if __name__ == "__main__":
    from logra.rollout import _serve as serve  # so pickled classes name logra.rollout, not __main__
    fd, model_dir, dtype, threads = sys.argv[1:]
    serve(Connection(int(fd)), model_dir, dtype, int(threads))
