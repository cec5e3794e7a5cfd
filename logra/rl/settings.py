"""One run's settings, typed and frozen: what `logra.harness.config.run_config` resolves for a
(task, method, seed), as the loop, the update step and the estimators read it.

The schema (workflow/schemas/config.schema.yaml) stays the only source of defaults and
descriptions: the fields here have none, and `from_dict` takes a validated run config, which
holds every key (the schema fills each). An unknown or missing key is an error naming it.
`to_dict` is the plain data summary.json stores, checkpoints compare and torchrun's ranks read
back (run_config.json).
"""
from __future__ import annotations

import dataclasses
import typing


def _build(cls, data: dict, where: str):
    """`cls` from `data`: every field given, no other key; a nested dataclass field built from
    its dict."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = sorted(set(names) - set(data))
    if unknown or missing:
        raise KeyError(f"{where}: " + "; ".join(
            ([f"unknown key(s) {unknown}"] if unknown else [])
            + ([f"missing key(s) {missing}"] if missing else []))
            + " (a run's settings come from a validated config: logra.harness.config)")
    hints = typing.get_type_hints(cls)
    return cls(**{name: _build(hints[name], data[name], f"{where}.{name}")
                  if dataclasses.is_dataclass(hints[name]) else data[name] for name in names})


@dataclasses.dataclass(frozen=True)
class Grpo:
    """The `grpo` keys of one run (the schema describes each), its method's own over the
    config's."""
    steps: int
    prompts_per_step: int
    group_size: int
    estimator: str
    baseline_weight: float
    failure_reward: float
    importance_cap: float
    length_reference: float | None
    micro_batch_size: int
    max_new_tokens: int
    temperature: float
    clip_low: float
    clip_high: float
    aggregation: str
    scale_advantages: bool
    beta: float
    gradient_checkpointing: bool
    profile_step: int
    measure_memory: bool
    warmup_steps: int
    decay_steps: int
    decay_final: float
    checkpoint_every: int
    snapshot_every: int
    cosine_step: int
    on_bad_checkpoint: str
    max_kl_per_step: float
    max_weight_norm_ratio: float
    max_zero_grad_steps: int
    probe_size: int
    chunk_tokens: int | None
    nproc_per_node: int
    compute_dtype: str
    param_dtype: str

    @classmethod
    def from_dict(cls, data: dict) -> Grpo:
        return _build(cls, data, "grpo")


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The run's rollout engine: the `rollout` section, its method's own keys over it, `sync`
    resolved to the transport the run applies."""
    engine: str
    options: dict
    dtype: str
    full_sync_every: int
    timeout_s: float
    timeout_factor: float
    sync: str


@dataclasses.dataclass(frozen=True)
class Task:
    type: str
    options: dict


@dataclasses.dataclass(frozen=True)
class Method:
    """The update rule (logra.rules), its options on this task (with the run's seed where the
    rule takes one) and the config's step control, if any."""
    rule: str
    options: dict
    kl_control: dict | None


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything one (task, method, seed) run needs."""
    run_id: str
    task_name: str
    method_name: str
    seed: int
    device: str
    threads: int
    memory_budget_bytes: int | None
    task: Task
    method: Method
    model_name: str
    grpo: Grpo
    rollout: Rollout

    @classmethod
    def from_dict(cls, data: dict) -> RunSettings:
        return _build(cls, data, "run config")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> RunSettings:
        return dataclasses.replace(self, **changes)
