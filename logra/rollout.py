"""Rollout engines: generate G completions per prompt from a copy of the policy weights.

An engine owns its own copy of the weights, in its own process, exactly as vLLM does on GPUs:
the trainer never shares tensors with it and changes them only through sync payloads
(`logra/sync.py`). `HFRolloutEngine` runs Hugging Face `generate` in a spawned subprocess and
talks to it over a pipe; every engine offers

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

from logra.sync import apply_payload, payload_bytes


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


ENGINES = {"hf": HFRolloutEngine}


def make_engine(name: str, model_dir: str, **options):
    """Engine by config name (`rollout.engine`)."""
    if name not in ENGINES:
        raise ValueError(f"rollout.engine: unknown {name!r}; known: {sorted(ENGINES)}")
    return ENGINES[name](model_dir, **options)


if __name__ == "__main__":
    from logra.rollout import _serve as serve  # so pickled classes name logra.rollout, not __main__
    fd, model_dir, dtype, threads = sys.argv[1:]
    serve(Connection(int(fd)), model_dir, dtype, int(threads))
