"""The method interface: every update rule (dense Adam, LoGRA, GaLore, ...) is an `UpdateRule`.

A rule is one module that declares everything about itself: its class subclasses `UpdateRule`,
states its `options` (JSON-schema fragments; the config check validates `methods.*.options`
against them), whether it can run sharded, whether its step can be scaled, its analytic memory for
the planner (`planned`, `planned_sync`), and implements `propose() -> step`, `apply(step, scale)`
(W += scale · step), `perturbed(step, eta)` (forwards see θ + eta · step), `state_tensors()`,
`state_dict()`, `load_state_dict(state)` and, where the defaults do not hold for it,
`sync_payload()`, `engine_weights()`, `unwrap()`, `dense_gradients()`, `grad_buffers()`,
`state_bytes()`, `peak_grad_bytes()`, `grad_norm`. The RL loop, the config check, the planner,
the report and the figures call only these, so nothing outside a rule's module branches on its
name. A rule is named in the config by its entry in `RULES` or by its import path.

Each method in full: docs/rules.md; README "Add an update rule" walks through one.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from logra.optim.collectives import full, local

# option types, as JSON-schema fragments over the config schema's $defs
LR = {"$ref": "#/$defs/lr"}  # a learning rate, or one per task
POSINT = {"$ref": "#/$defs/posint"}
POSNUM = {"$ref": "#/$defs/posnum"}
BETAS = {"$ref": "#/$defs/betas"}
ADAM_OPTIONS = {"lr": LR, "betas": BETAS, "eps": POSNUM,
                "weight_decay": {"type": "number", "minimum": 0}}


# the Linear weights a low-rank rule targets by default (LoGRA, GaLore, APOLLO, LoRA): every
# projection of attention and MLP in each decoder block
DEFAULT_MODULES = r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"


def low_rank_linears(model: torch.nn.Module, modules: str) -> list[tuple[str, torch.nn.Linear]]:
    """(name, module) of every trainable nn.Linear whose name matches the regex `modules`."""
    pattern = re.compile(modules)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and pattern.search(name) and m.weight.requires_grad]
    if not found:
        raise ValueError(f"modules: pattern {modules!r} matches no nn.Linear in the model")
    return found


def requires_grad_output(module, args, output):
    """A forward hook for the input embedding of a model whose embedding is frozen (LoGRA's,
    dense AdamW's `train_only`): its output requires grad, so backward reaches the trained
    weights of the blocks, under gradient checkpointing too."""
    if torch.is_grad_enabled():
        output.requires_grad_(True)
    return output


@dataclass(frozen=True)
class Geometry:
    """What the planner knows of a model, for a rule's analytic memory: the parameter count,
    the (m, n) of each weight the rule's `modules` regex selects, the largest parameter, every
    parameter's (name, shape), and the attention head size (for rules that partition weights
    by name and head, e.g. Adam-mini)."""
    n_all: int
    low_rank: tuple[tuple[int, int], ...]
    largest: int
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    head_dim: int = 0

    @property
    def n_low(self) -> int:
        return sum(m * n for m, n in self.low_rank)


class UpdateRule:
    """Base of every update rule: the declarations with their defaults, and the default bodies
    for a rule that trains `self.named` (its (name, parameter) list) and keeps full gradients
    in `.grad`."""
    options: dict = {}             # option name -> JSON-schema fragment (see ADAM_OPTIONS)
    shardable: bool = False        # runs under FSDP (grpo.nproc_per_node > 1)
    scalable: bool = True          # apply() takes any scale: predicted-KL control can run
    # a rule that is not scalable forms and applies its update in propose(): the loop sets the
    # schedule's factor (warmup, decay) here before it, and the rule scales its lr by it there
    lr_scale: float = 1.0
    # sync transports that apply (logra/rl/weight_sync.py); the first is the rule's own (`auto`):
    # a rule whose sync_payload() is low-rank puts "low_rank" first
    transports: tuple[str, ...] = ("full", "delta")
    # classes a weights-only load may rebuild in state_dict() (from their attributes, no code
    # of theirs runs), e.g. a package's projector objects kept in an optimizer's state (a rule
    # that imports its package when built sets it then)
    checkpoint_classes: tuple[type, ...] = ()
    named: list
    grad_norm: float = float("nan")
    # completion tokens of the update's whole batch (all ranks), set by the loop before
    # propose(); a rule that normalises by it reads it (LoGRA's T)
    batch_tokens: int = 1
    # the rule's own step control (between propose and apply), or None: then the config's
    # `kl_control`, if any (logra/optim/kl_control.py)
    control = None
    # the option a regime scales (logra/harness/derived.py): the step size
    step_size_option: str = "lr"
    # the option that spans the rule's own schedule of its step, in updates (LoGRA's KL
    # budget's cosine), or None: the loop's lr schedule shapes its step (grpo.warmup_steps,
    # decay_steps, decay_final). A study horizon sets one or the other (logra/harness/horizons.py)
    schedule_option: str | None = None

    @classmethod
    def tuning_option(cls, options: dict) -> str:
        """The option a tuning sweep's point sets (`tuned`): the step size."""
        return cls.step_size_option

    @classmethod
    def tuning_power(cls, options: dict) -> int:
        """How the tuning option moves with the step size it makes: option ∝ step^power (an
        lr: 1). A tuning grid spaced by a factor in step size spaces its option by
        factor^power (logra.harness.derived.Grid), so every method's grid spans the same range of
        steps."""
        return 1

    @classmethod
    def tuned(cls, options: dict, value: float) -> dict:
        """The options of a tuning sweep's point `value`: `options` with the step size
        replaced."""
        return {**options, cls.step_size_option: value}

    def propose(self):
        raise NotImplementedError

    def apply(self, step, scale: float = 1.0) -> None:
        raise NotImplementedError

    def perturbed(self, step, eta: float):
        raise NotImplementedError(f"{type(self).__name__}: its step cannot be evaluated at "
                                  "θ + η·step (no predicted-KL control)")

    def state_tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def sync_payload(self) -> dict:
        """Every trained tensor in full, as vLLM's `load_weights` would receive it."""
        return {"dense": self.engine_weights()}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        return {n: full(p.detach()) for n, p in self.named}  # FSDP: gathered (collective)

    def unwrap(self) -> None:
        pass  # the model is the plain architecture already

    def dense_gradients(self):
        """Backward leaves whole gradients in .grad already (a rule that consumes them in hooks
        raises NotImplementedError, and the diagnostic is skipped)."""
        return contextlib.nullcontext()

    def grad_buffers(self) -> list[torch.Tensor]:
        return []  # gradients live in .grad, which the memory profiler labels itself

    def state_bytes(self) -> int:
        return tensor_bytes(self.state_tensors())

    def peak_grad_bytes(self) -> int:
        """Analytic: every trained parameter's gradient is alive at the end of backward."""
        return tensor_bytes(p for _, p in self.named)

    # -- the planner's analytic model (logra/measure/planner.py) -----------------------------------
    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Predicted bytes on one GPU before sharding, policy dtype `b` bytes, fp32 state:
        `weights`, `master` (fp32 master copy under a bf16 policy: b < 4), `grads` (alive at
        the end of backward), `optimizer`, `step` (the proposed step beyond the gradient
        buffers), `perturbed_copy` (the copy `perturbed` restores from), `after_apply` (what
        survives apply), `transient` (formed and freed inside propose), `frozen_base` (the
        base weights, lm_head too, are frozen: no activations kept for their gradients); and
        optionally `replicated`, the categories kept whole on every rank under FSDP."""
        raise NotImplementedError("this rule declares no analytic memory (UpdateRule.planned)")

    @staticmethod
    def planned_sync(geo: Geometry, options: dict, b: int) -> int:
        """Predicted bytes of one policy sync by the rule's own transport: every weight in the
        policy dtype."""
        return geo.n_all * b

    @staticmethod
    def has_control(options: dict) -> bool:
        """Whether a rule built with `options` brings its own step control (`control`), for the
        planner, which does not build it."""
        return False

    @staticmethod
    def modules(options: dict) -> str:
        """The regex over module names of the Linear weights the rule treats as low rank (the
        planner's `Geometry.low_rank`): its `modules` option by default."""
        return options.get("modules", DEFAULT_MODULES)

    @staticmethod
    def planned_trained(geo: Geometry, options: dict) -> int:
        """Words the engine is sent by the generic transports (`engine_weights`): every weight."""
        return geo.n_all


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of the `nbytes` of the *unique* storages behind `tensors`.

    Tensors sharing a storage (tied embeddings, views) are counted once; a view counts its whole
    storage; a sharded DTensor counts this rank's shard.  `None` entries are skipped.  Tensors
    without a regular storage (sparse, nested, ...) fall back to `numel * element_size`.
    """
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local(t)  # FSDP: the bytes this rank holds
        try:
            st = t.untyped_storage()
            key = (str(st.device), st.data_ptr())
            nbytes = st.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            total += t.numel() * t.element_size()
            continue
        if nbytes == 0:
            continue
        if key[1] == 0:  # meta / fake tensors: no address to dedupe on
            total += nbytes
            continue
        if key in seen:
            continue
        seen.add(key)
        total += nbytes
    return total
