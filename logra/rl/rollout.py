"""Rollout engines: generate G completions per prompt from a copy of the policy weights.

An engine owns its own copy of the weights, in its own process, exactly as vLLM does on GPUs:
the trainer never shares tensors with it and changes them only through sync payloads
(`logra/rl/weight_sync.py`). `HFRolloutEngine` runs Hugging Face `generate` in a subprocess
of its own and talks to it over a pipe; `VLLMRolloutEngine` (logra/rl/vllm_engine.py) runs
vLLM, on a GPU or with vLLM's CPU build on a CPU. Every engine offers `generate`, `sync`,
`state_dict` and `close`, and raises `EngineError` when the engine fails, dies or does not
answer in time: a call to the HF engine's process waits at most max(`timeout_s`,
`timeout_factor` x the longest earlier call of the same kind).

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

from logra.rl.weight_sync import apply_payload, deserialize, serialize


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


if __name__ == "__main__":
    from logra.rl.rollout import _serve as serve
    fd, model_dir, dtype, threads = sys.argv[1:]
    serve(Connection(int(fd)), model_dir, dtype, int(threads))
    # told to close: the interpreter's teardown (about a second with torch loaded) would only
    # free memory the process gives back on exit anyway
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
