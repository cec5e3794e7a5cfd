"""Policy synchronisation: what the trainer sends the rollout engine after a step, and how.

A payload is a plain dict, the same for every engine (HF generate in a subprocess here, vLLM
workers on GPUs), with parts "dense", "delta", "lowrank" and "lora". Transports (`TRANSPORTS`;
config `rollout.sync`, per method `methods.<name>.sync`): `full` (every trained weight),
`delta` (the words whose engine-dtype value changed since the last sync) and `low_rank` (the
rule's own `sync_payload()`). `EngineSync` runs them after every step: it applies the configured
one and counts what every applicable one would send, the length of its serialized payload
(`serialize`, what the hand-over carries), so one run compares them.

`apply_payload` is the only code that changes rollout weights. `payload_bytes` is the raw
tensor bytes of a payload (what the planner's `planned_sync` predicts).

The payload's layout, each transport and LoRA adapter sync: docs/weight_sync.md.
"""
from __future__ import annotations

import io
import time

import torch

from logra.common import SYNC_METRICS, TRANSPORTS
from logra.optim.logra_rule import projection
from logra.optim.sketch import lift_add_, lora_merged, subtract_projected_


def transport(requested: str, rule_cls) -> str:
    """The transport a run of `rule_cls` uses for config value `requested` (`auto`: the rule's
    own, the first of its `transports`); ValueError if it does not apply to the rule."""
    if requested == "auto":
        return rule_cls.transports[0]
    if requested not in rule_cls.transports:
        raise ValueError(f"transport {requested!r} does not apply to rule {rule_cls.__name__} "
                         f"(it takes {list(rule_cls.transports)})")
    return requested


SECTIONS = ("delta", "lowrank", "lora")  # name -> {key: tensor or value}; "dense" is flat


def payload_bytes(payload: dict) -> int:
    """Bytes of every tensor in the payload (raw; the bytes sent are `serialized_bytes`)."""
    total = sum(t.numel() * t.element_size() for t in payload.get("dense", {}).values())
    for section in SECTIONS:
        for entry in payload.get(section, {}).values():
            total += sum(v.numel() * v.element_size() for v in entry.values()
                         if isinstance(v, torch.Tensor))
    return total


def serialize(payload: dict) -> bytes:
    """The payload as it is handed to an engine: `torch.save`d to bytes (zip format), tensors
    on the CPU, each with a storage of its own size (torch.save writes whole storages). Not
    plain pickle: a pickled tensor names its storage by its memory address, so the same
    payload's length would change from run to run."""
    buffer = io.BytesIO()
    torch.save(_map(payload, lambda t: _own_storage(t.to("cpu"))), buffer)
    return buffer.getvalue()


def deserialize(data: bytes) -> dict:
    """The payload `serialize` wrote (tensors, strings, numbers and None only)."""
    return torch.load(io.BytesIO(data), weights_only=True)


def serialized_bytes(payload: dict) -> int:
    """Bytes a transport carries for `payload`: the length of `serialize(payload)`."""
    return len(serialize(payload))


def payload_to(payload: dict, device: torch.device | str) -> dict:
    """The payload with every tensor on `device` (for a transport, or an engine's GPU)."""
    return _map(payload, lambda t: t.to(device))


def _map(payload: dict, fn) -> dict:
    """The payload with `fn` applied to every tensor."""
    return {"dense": {k: fn(v) for k, v in payload.get("dense", {}).items()},
            **{section: {k: {key: fn(v) if isinstance(v, torch.Tensor) else v
                             for key, v in e.items()}
                         for k, e in payload.get(section, {}).items()}
               for section in SECTIONS if section in payload}}


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """`t`, copied if it views into a larger storage (a sliced, gathered buffer under FSDP):
    torch.save writes whole storages, a transport sends the tensor."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The words of `t` as integers of the same width: compared bit for bit (-0.0 != 0.0)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        t.element_size()])


def delta_payload(held: dict[str, torch.Tensor],
                  new: dict[str, torch.Tensor]) -> tuple[dict, int]:
    """The `delta` payload that turns `held` (what the engine holds) into `new` (both in the
    engine's dtype, contiguous), and how many words changed. Indices are flat positions,
    int32 for a tensor of fewer than 2^31 words, else int64; unchanged tensors are left out."""
    delta, changed = {}, 0
    for name, w in new.items():
        index = (_bits(w) != _bits(held[name])).view(-1).nonzero().squeeze(1)
        changed += index.numel()
        if index.numel():
            index = index.to(torch.int32 if w.numel() < 2**31 else torch.int64)
            delta[name] = {"index": index, "value": w.view(-1)[index]}
    return {"delta": delta}, changed


def in_dtype(payload: dict, dtype: torch.dtype) -> dict:
    """The payload with its `dense` tensors in `dtype` (the engine's): the engine overwrites
    with them, so casting before sending changes nothing it ends up holding."""
    return {**payload, "dense": {k: v.to(dtype) for k, v in payload.get("dense", {}).items()}}


@torch.no_grad()
def apply_payload(params: dict[str, torch.Tensor], payload: dict,
                  bases: dict[str, torch.Tensor]) -> None:
    """Apply `payload` in place to `params` (name -> tensor of the engine's model).

    `delta` words are overwritten with values of the engine's own dtype (index_put refuses
    any other). `bases` is the engine's cache of the last basis received per low-rank weight,
    updated when a payload carries a new one (for LoGRA's: (seed, A), A drawn here from the
    seed), and of each LoRA-adapted weight's base (under the key `lora_base:<name>`). Low-rank
    steps are added with `lift_add_`, the same function the
    trainer applies them with (`subtract_projected_` for LoGRA's); adapters are merged with
    `lora_merged`, as the trainer merges.
    """
    for name, tensor in payload.get("dense", {}).items():
        params[name].copy_(tensor)
    for name, entry in payload.get("delta", {}).items():  # view(-1): contiguous, or it raises
        params[name].view(-1)[entry["index"].long()] = entry["value"]  # dtypes must match
    for name, entry in payload.get("lowrank", {}).items():
        if entry["side"] == "projected":  # A from its seed; kept while the seed repeats
            held = bases.get(name)
            if held is None or held[0] != entry["seed"]:
                bases[name] = (entry["seed"], projection(
                    entry["coef"].shape[1], params[name].shape[1], entry["seed"],
                    entry["distribution"], params[name].device))
            subtract_projected_(params[name], entry["coef"], bases[name][1])
            continue
        if entry.get("basis") is not None:
            bases[name] = entry["basis"]
        if name not in bases:
            raise KeyError(f"low-rank sync for {name} before any basis was sent")
        lift_add_(params[name], bases[name], entry["coef"], entry["side"])
    for name, entry in payload.get("lora", {}).items():
        key = f"lora_base:{name}"
        if entry.get("base") is not None:
            bases[key] = entry["base"]
        elif key not in bases:  # the first adapter sync: the engine holds the base it loaded
            bases[key] = params[name].detach().clone()
        params[name].copy_(lora_merged(bases[key], entry["A"], entry["B"], entry["scale"]))


class EngineSync:
    """The trainer's side of the sync, one per run and rank (the rule's gathers are collectives
    under FSDP; only rank 0 holds an engine and gets metrics).

    After each applied step `step(engine)` builds the payload of every transport that applies
    to the rule (`rule.transports`), hands the configured one to the engine and returns the
    step's metrics: `sync_bytes` (sent), `sync_bytes_<transport>` (each one's serialized
    length; None where it does not apply), `sync_seconds` (the applied one: its packing +
    serialization + hand-over + the engine's apply, measured on the trainer's clock, as the
    engine replies once it has applied) and `sync_changed_fraction` (trained words whose
    engine-dtype value changed in this step, over all trained words).

    What the engine holds is known without asking it: `held` is `cast(W)` at the last sync,
    the trained weights in the engine's dtype, kept in host memory (trained words x the
    engine's bytes: 2 B per parameter in bf16, 4 in fp32; on the host so that a GPU run's
    measured peak stays the method's). Under `full` and `delta` the engine holds `held`
    exactly, by induction from its load of the same base (rounded to nearest, as `cast`).
    Under `low_rank` in bf16 it drifts away from it: `held` is then what an engine synced by
    `delta` all along would hold, and the `delta` bytes are that run's.

    Costs beyond the applied transport, every step: the trained weights copied to the host in
    the engine's dtype (two such copies alive for a moment), compared word by word, and every
    applicable payload but `full` serialized once more for its length. The `full` payload's
    length depends only on the names, dtypes and shapes (torch.save stores, never compresses):
    it is measured once, on `held`.
    """

    def __init__(self, rule, transport_name: str, dtype: torch.dtype, has_engine: bool,
                 engine_path: dict | None = None):
        self.rule, self.dtype = rule, dtype
        self.engine_path = engine_path  # the engine's `sync_path()`: where payloads land
        self.transport = transport(transport_name, type(rule))
        weights = rule.engine_weights()  # a collective under FSDP
        self.held = self._cast(weights) if has_engine else None
        self.full_bytes = serialized_bytes({"dense": self.held}) if has_engine else None
        self.lowrank: dict = {}  # the last step's `lowrank` section, if any

    def _cast(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: w.to("cpu", self.dtype, copy=True).contiguous() for n, w in weights.items()}

    def step(self, engine) -> dict:
        """Sync `engine` (None on ranks > 0, which only join the collectives) after a step."""
        low_rank = "low_rank" in self.rule.transports
        t0 = time.perf_counter()
        weights = self.rule.engine_weights()
        if engine is None:
            if low_rank:  # the rule's own payload is formed every step (it gathers, too)
                self.rule.sync_payload()
            return dict.fromkeys(SYNC_METRICS, float("nan"))
        new = self._cast(weights)
        del weights
        t1 = time.perf_counter()
        delta, changed = delta_payload(self.held, new)
        t2 = time.perf_counter()
        payloads, pack = {"full": {"dense": new}, "delta": delta}, {"full": t1 - t0,
                                                                    "delta": t2 - t0}
        if low_rank:  # every step, applied or not: the rule records what it has sent
            payloads["low_rank"] = in_dtype(self.rule.sync_payload(), self.dtype)
            pack["low_rank"] = time.perf_counter() - t2
        self.lowrank = payloads.get("low_rank", {}).get("lowrank", {})  # LoGRA's factors
        t3 = time.perf_counter()
        sent = engine.sync(payloads[self.transport])
        seconds = pack[self.transport] + time.perf_counter() - t3
        self.held = new
        return {"sync_bytes": sent, "sync_seconds": seconds,
                **{f"sync_bytes_{t}": (sent if t == self.transport else
                                       self.full_bytes if t == "full" else
                                       serialized_bytes(payloads[t]) if t in payloads else None)
                   for t in TRANSPORTS},
                "sync_changed_fraction": changed / sum(w.numel() for w in new.values())}

    def resync(self, engine) -> int:
        """Send every trained weight in full (`held`, what the last step's sync left the
        trainer at); returns the bytes sent."""
        return engine.sync({"dense": self.held})
