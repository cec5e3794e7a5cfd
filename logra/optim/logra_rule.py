"""LoGRA, as its authors wrote it: per-update random projections, RowAdam, a step set by a
predicted-KL budget.

The definition is the authors' code (Apache-2.0), repository `skzhang1/RL`:
`nemo_rl/models/automodel/logra.py` (projections, sketch accumulation, RowAdam, the
optimizer), `nemo_rl/models/automodel/logra_probe.py` (the controller: here
`logra.optim.kl_control.BudgetControl`), the integration in
`nemo_rl/models/policy/workers/dtensor_policy_worker_v2.py`, the runs in
`research/logra/configs/logra-s1.yaml`. Implemented here from their arithmetic; the options are
theirs, named and defaulted as theirs.

Targets: every nn.Linear whose last name component is in `target_modules` (q, k, v, o, gate,
up, down). Every parameter of the model is frozen (embeddings, norms, lm_head, biases);
targets change only through LoGRA, and none ever has a weight gradient. The embedding's output
is made to require grad, so backward reaches the blocks.

Per target W (out x in), per update k (0-based, the count of updates before it):
1. Projection A (r x in), float32: Rademacher ±1/√r (uint8 `randint` bits) or Gaussian
   (float64 normal, scaled by 1/√r), drawn on a CPU generator seeded with
   (seed·1,000,003 + k·7,919 + digest) mod 2⁶², digest = little-endian blake2b-8 of the module
   name without wrapper parts (`projection_seed`). With `refresh` it is redrawn after every
   update with the new count, else drawn once with k = 0.
2. Sketch: the forward saves P = X·Aᵀ (tokens x r, the activation dtype) instead of X; backward
   adds Gᵀ·P (out x r) into S, float32. S = (∂L/∂W)·Aᵀ, summed over micro-batches.
3. RowAdam on s = S / T, T = the batch's completion tokens (`batch_tokens`; the loss is already
   a token mean, the authors divide again): v ← β₂v + (1−β₂)·mean_row(s²) per output row;
   root = √(v / (1−β₂^(k+1))); d = root + max(ε·mean(root), tiny); scale = min(d)/d,
   normalised to unit RMS; D = scale ⊙ s, rescaled to ‖s‖. No first moment; v is kept across
   refreshes (it is indexed by output row).
4. Global step size: D ← D · update_ratio · ‖W‖ / ‖D·A‖, both norms over all targets together
   (‖D·A‖ formed in 256-row chunks, float64 sums), so ‖ΔW‖ = update_ratio·‖W‖ at α = 1.
5. α from the controller (`logra.optim.kl_control.BudgetControl`, option `controller`), 1 without.
6. W −= (α·D rounded to `update_factor_dtype`)·A, 256 rows at a time
   (`logra.optim.sketch.subtract_projected_`), then the count advances and A is redrawn.

Under FSDP (logra/rl/fsdp.py) each rank holds a row block of W; S, v, A and D are whole on
every rank: S is summed over the ranks, then divided by the world size (the loop multiplies
each rank's loss by the world size), every rank forms the same D and updates its own rows; the
rule gathers nothing of W (its sync payload, α·D and A's seed, is whole on every rank; the harness's
sync metrics gather the weights to count the other transports' bytes).

Deviations from the authors' code, stated:
- A non-finite sketch does not raise (theirs: FloatingPointError): propose() returns a step
  without directions, the moments and the count stay as they were, apply() changes nothing, and
  the harness stops the run as diverged (its gradient norm is NaN).
- `grad_norm` is ‖S‖ over all targets before the division by T, as the authors log it.
- The controller is a separate object (`control`), called by the harness's loop between
  propose() and apply() (theirs: a function called by their worker); the harness adds the
  realized KL on probe sequences the prediction did not see. `controller: false` fixes α = 1,
  an ablation.
- Sync: the payload carries, per target, the applied factor α·D (in `update_factor_dtype`)
  and the seed of the projection it was applied with; the engine draws A from the seed
  (`projection`) and applies W −= F·A with the trainer's own function. The authors' runs sync
  full weights.
- `seed` defaults to 42 here as in theirs; the harness passes the run's seed (their configs
  set `seed` to the run's seed).
- `perturbed` (θ + η·step through side branches on the targets' outputs) serves the harness's
  other controller (`kl_control` in the config), for this rule without its own.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import re
from dataclasses import dataclass, field

import torch
import torch.autograd.forward_ad as fwAD

from logra.optim import collectives
from logra.optim.collectives import full, is_sharded, local, row_block
from logra.optim.rule import (LR, POSINT, POSNUM, Geometry, UpdateRule, requires_grad_output,
                              tensor_bytes)
from logra.optim.sketch import subtract_projected_

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WRAPPER_PARTS = {"_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod"}
DISTRIBUTIONS = ("rademacher", "gaussian")
FACTOR_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
CHUNK_ROWS = 256  # rows of D·A formed at a time (norm and update)
MASK_62 = (1 << 62) - 1


def projection_seed(seed: int, update: int, name: str) -> int:
    """(seed·1,000,003 + update·7,919 + digest) mod 2⁶², digest = blake2b-8 (little-endian) of
    `name` without the wrapper components FSDP, activation checkpointing and torch.compile
    insert."""
    name = ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (seed * 1_000_003 + update * 7_919 + digest) & MASK_62


def projection(rank: int, width: int, seed: int, distribution: str = "rademacher",
               device: torch.device | str = "cpu") -> torch.Tensor:
    """A (rank x width), float32, drawn on a CPU generator (the same matrix on every device):
    Rademacher ±1/√rank from uint8 bits, or Gaussian N(0, 1/rank) drawn in float64."""
    gen = torch.Generator(device="cpu").manual_seed(seed & MASK_62)
    if distribution == "rademacher":
        bits = torch.randint(0, 2, (rank, width), generator=gen, dtype=torch.uint8)
        a = bits.to(torch.float32).mul_(2).sub_(1).mul_(1 / math.sqrt(rank))
    elif distribution == "gaussian":
        a = torch.randn(rank, width, generator=gen, dtype=torch.float64)
        a = a.mul_(1 / math.sqrt(rank)).to(torch.float32)
    else:
        raise ValueError(f"distribution: unknown {distribution!r}; known: {DISTRIBUTIONS}")
    return a.to(device)


def row_adam(s: torch.Tensor, v: torch.Tensor, step: int, beta2: float,
             epsilon: float) -> torch.Tensor:
    """RowAdam's direction for the normalised sketch `s` (out x r); updates the per-row second
    moment `v` (out x 1) in place. `step` counts from 1 (bias correction)."""
    tiny = torch.finfo(s.dtype).tiny
    v.mul_(beta2).add_(s.square().mean(dim=1, keepdim=True), alpha=1 - beta2)
    root = (v / (1 - beta2 ** step)).sqrt()
    den = root + max(epsilon * root.mean().item(), tiny)
    scale = den.min() / den
    scale = scale / scale.square().mean().sqrt().clamp(min=tiny)
    direction = scale * s
    return direction.mul_(torch.linalg.vector_norm(s) /
                          torch.linalg.vector_norm(direction).clamp(min=tiny))


class _AccumulateSketch(torch.autograd.Function):
    """Identity on a target's output that keeps P = X·Aᵀ for backward (autograd owns it and
    frees it after backward) and there adds Gᵀ·P to the target's sketch S, counting the
    backward pass."""

    @staticmethod
    def forward(ctx, output, projected, target):
        ctx.save_for_backward(projected)
        ctx.target = target
        return output

    @staticmethod
    def backward(ctx, grad):
        (projected,) = ctx.saved_tensors
        with torch.no_grad():
            ctx.target.s.add_((grad.reshape(-1, grad.shape[-1]).T @ projected).float())
        ctx.target.backwards += 1
        return grad, None, None


@dataclass
class Target:
    """One target Linear: its weight, projection A, sketch S and row second moment v."""
    name: str  # the module's name
    module: torch.nn.Linear
    a: torch.Tensor  # r x in, float32
    s: torch.Tensor  # out x r, float32
    v: torch.Tensor  # out x 1, float32
    applied: tuple | None = field(default=None, repr=False)  # (factor, A's update index)
    backwards: int = 0  # backward passes sketched into S since it was last consumed

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.module.weight


def _per_task(f, *values):
    """f(*values) rounded to 12 significant digits, or {task: that} where a value is given per
    task ({task: value}, `default` for the tasks it does not name)."""
    tasks = sorted({t for v in values if isinstance(v, dict) for t in v})
    def at(task):
        return [v.get(task, v.get("default")) if isinstance(v, dict) else v for v in values]
    if not tasks:
        return float(f"{f(*values):.12g}")
    return {t: float(f"{f(*at(t)):.12g}") for t in tasks}


def _check_options(**values) -> None:
    """Each option of `LoGRA` of its type and in its range (finite numbers), before the model
    is touched: a NaN step size would write NaN weights, a negative budget fail in a square
    root steps later. Whole numbers are ints (not bools), switches bools."""
    for key in ("rank", "seed", "schedule_steps", "probe_responses", "probe_max_tokens"):
        value, low = values[key], 0 if key == "seed" else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{key}: an integer >= {low}, got {value!r}")
    for key, (low, high) in {"beta2": ("[0", "1)"), "epsilon": ("(0", "inf)"),
                             "update_ratio": ("(0", "1]"), "kl_budget": ("(0", "inf)"),
                             "kl_budget_final": ("(0", "inf)"), "alpha_max": ("(0", "inf)"),
                             "mismatch_ema_weight": ("(0", "1]"),
                             "mismatch_budget_floor": ("[0", "1]")}.items():
        value, lo, hi = values[key], float(low[1:]), float(high[:-1])
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and (value >= lo if low[0] == "[" else value > lo)
                and (value <= hi if high[-1] == "]" else value < hi)):
            raise ValueError(f"{key}: a finite number in {low}, {high}, got {value!r}")
    for key in ("refresh", "controller", "mismatch_subtraction"):
        if not isinstance(values[key], bool):
            raise ValueError(f"{key}: true or false, got {values[key]!r}")


class LoGRA(UpdateRule):
    options = {
        "rank": POSINT | {"description": "r: rows of each projection A (authors: 256 at "
                          "hidden 1,536)"},
        "seed": {"type": "integer", "minimum": 0, "description": "projection seed (default: "
                 "the run's seed)"},
        "distribution": {"type": "string", "enum": list(DISTRIBUTIONS)},
        "refresh": {"type": "boolean", "description": "redraw every A after each update"},
        "update_factor_dtype": {"type": "string", "enum": list(FACTOR_DTYPES),
                                "description": "α·D is rounded to it before W −= (α·D)·A"},
        "beta2": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "epsilon": POSNUM | {"description": "RowAdam's ε, relative to the mean root"},
        "target_modules": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                           "description": "names (last component) of the Linear modules updated"},
        "update_ratio": LR | {"description": "the step size: ‖ΔW‖ / ‖W‖ over all targets at "
                              "α = 1 (one per task, as an lr may be)"},
        "controller": {"type": "boolean", "description": "α from the predicted-KL budget "
                       "(logra.optim.kl_control.BudgetControl); false: α = 1"},
        "kl_budget": LR | {"description": "budget of the first update (nats; one per task, as "
                           "an lr may be)"},
        "kl_budget_final": LR | {"description": "budget at schedule_steps (cosine)"},
        "schedule_steps": POSINT,
        "alpha_max": POSNUM,
        "probe_responses": POSINT | {"description": "sequences of the batch the prediction "
                                     "probes (the first ones)"},
        "probe_max_tokens": POSINT,
        "mismatch_subtraction": {"type": "boolean", "description": "subtract the EMA of the "
                                 "engine-minus-trainer log-prob mismatch from the budget"},
        "mismatch_ema_weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "mismatch_budget_floor": {"type": "number", "minimum": 0, "maximum": 1},
    }
    shardable = True
    transports = ("low_rank", "full", "delta")  # its own: the applied factors
    step_size_option = "update_ratio"
    schedule_option = "schedule_steps"

    @classmethod
    def tuning_option(cls, options: dict) -> str:
        """The authors' knob: the KL budget (the step size without the controller)."""
        return "kl_budget" if options.get("controller", True) else cls.step_size_option

    @classmethod
    def tuning_power(cls, options: dict) -> int:
        """The KL budget moves as the step squared: the controller sets the step's predicted
        KL, quadratic in its size, to the budget (α = √(budget / KL of the α = 1 step)), and
        `tuned` moves update_ratio by the budget's root, so the step grows as √budget."""
        return 2 if cls.tuning_option(options) == "kl_budget" else 1

    @classmethod
    def tuned(cls, options: dict, value: float) -> dict:
        """A sweep point of the KL budget (with the controller): kl_budget = `value`,
        kl_budget_final in the configured proportion (the authors': a tenth) and update_ratio
        times √(value / the configured budget), so that the α = 1 step's predicted KL, which
        grows as the step squared, keeps its ratio to the budget and α its distance from
        alpha_max. Values given per task are scaled task by task; results are rounded to 12
        significant digits (the same point from any configured point of the family)."""
        if cls.tuning_option(options) != "kl_budget":
            return super().tuned(options, value)
        defaults = inspect.signature(cls).parameters
        budget, final, ratio = (options.get(k, defaults[k].default)
                                for k in ("kl_budget", "kl_budget_final", "update_ratio"))
        return {**options, "kl_budget": value,
                "kl_budget_final": _per_task(lambda b, f: value * f / b, budget, final),
                "update_ratio": _per_task(lambda b, r: r * math.sqrt(value / b), budget, ratio)}

    def __init__(self, model: torch.nn.Module, rank: int = 256, seed: int = 42,
                 distribution: str = "rademacher", refresh: bool = True,
                 update_factor_dtype: str = "bfloat16", beta2: float = 0.95,
                 epsilon: float = 1e-8, target_modules=TARGET_MODULES,
                 update_ratio: float = 6e-5, controller: bool = True, kl_budget: float = 2e-4,
                 kl_budget_final: float = 2e-5, schedule_steps: int = 300,
                 alpha_max: float = 3.0, probe_responses: int = 2,
                 probe_max_tokens: int = 4096, mismatch_subtraction: bool = True,
                 mismatch_ema_weight: float = 0.3, mismatch_budget_floor: float = 0.5):
        from logra.optim.kl_control import BudgetControl
        _check_options(rank=rank, seed=seed, schedule_steps=schedule_steps,
                       probe_responses=probe_responses, probe_max_tokens=probe_max_tokens,
                       beta2=beta2, epsilon=epsilon, update_ratio=update_ratio,
                       kl_budget=kl_budget, kl_budget_final=kl_budget_final, alpha_max=alpha_max,
                       mismatch_ema_weight=mismatch_ema_weight,
                       mismatch_budget_floor=mismatch_budget_floor, refresh=refresh,
                       controller=controller, mismatch_subtraction=mismatch_subtraction)
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution: unknown {distribution!r}; known: {DISTRIBUTIONS}")
        if update_factor_dtype not in FACTOR_DTYPES:
            raise ValueError(f"update_factor_dtype: unknown {update_factor_dtype!r}; known: "
                             f"{sorted(FACTOR_DTYPES)}")
        embeddings = getattr(model, "get_input_embeddings", lambda: None)()
        if not isinstance(embeddings, torch.nn.Module):
            raise TypeError(f"{type(model).__name__} has no get_input_embeddings() module (a "
                            "transformers model's): LoGRA hooks it so that the sketches' backward "
                            "runs with every weight frozen")
        self.config = {
            "rank": rank, "seed": seed, "distribution": distribution, "refresh": refresh,
            "update_factor_dtype": update_factor_dtype, "beta2": beta2, "epsilon": epsilon,
            "target_modules": list(target_modules), "update_ratio": update_ratio,
            "controller": controller, "kl_budget": kl_budget, "kl_budget_final": kl_budget_final,
            "schedule_steps": schedule_steps, "alpha_max": alpha_max,
            "probe_responses": probe_responses, "probe_max_tokens": probe_max_tokens,
            "mismatch_subtraction": mismatch_subtraction,
            "mismatch_ema_weight": mismatch_ema_weight,
            "mismatch_budget_floor": mismatch_budget_floor}
        self.rank, self.seed, self.distribution, self.refresh = rank, seed, distribution, refresh
        self.factor_dtype = FACTOR_DTYPES[update_factor_dtype]
        self.beta2, self.epsilon, self.update_ratio = beta2, epsilon, update_ratio
        self.count = 0  # updates applied
        self.grad_norm = float("nan")
        self.batch_tokens = 1
        self.prepared = False
        wanted = set(target_modules)
        found = [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in wanted]
        if not found:
            raise ValueError(f"target_modules: {sorted(wanted)} match no module of the model")
        self.targets: list[Target] = []
        for name, module in found:
            if not isinstance(module, torch.nn.Linear):
                raise TypeError(f"target_modules: {name} is a {type(module).__name__}, not an "
                                "nn.Linear")
            w = module.weight
            if w.dtype != torch.float32:
                raise ValueError(f"{name}.weight is stored in {w.dtype}: LoGRA requires float32 "
                                 "storage (compute may be bf16)")
            if rank > w.shape[1]:
                raise ValueError(f"rank={rank} exceeds the input width {w.shape[1]} of {name}")
            a = projection(rank, w.shape[1], projection_seed(seed, 0, name), distribution,
                           w.device)
            self.targets.append(Target(name, module, a, torch.zeros(w.shape[0], rank,
                                                                    device=w.device),
                                       torch.zeros(w.shape[0], 1, device=w.device)))
        model.requires_grad_(False)
        self.named = [(f"{t.name}.weight", t.weight) for t in self.targets]
        self.hooks = [t.module.register_forward_hook(self._sketch_hook(t))
                      for t in self.targets]
        self.hooks.append(embeddings.register_forward_hook(requires_grad_output))
        self.control = None if not controller else BudgetControl(
            kl_budget=kl_budget, kl_budget_final=kl_budget_final, schedule_steps=schedule_steps,
            alpha_max=alpha_max, probe_responses=probe_responses,
            probe_max_tokens=probe_max_tokens, mismatch_subtraction=mismatch_subtraction,
            mismatch_ema_weight=mismatch_ema_weight,
            mismatch_budget_floor=mismatch_budget_floor)

    @staticmethod
    def _sketch_hook(t: Target):
        def hook(module, args, output):
            if not torch.is_grad_enabled():
                return None
            with torch.no_grad():
                x = args[0].reshape(-1, args[0].shape[-1])
                projected = x @ t.a.to(x.dtype).T
            return _AccumulateSketch.apply(output, projected, t)
        return hook

    # -- propose / apply --------------------------------------------------------------------
    @torch.no_grad()
    def propose(self) -> dict:
        """RowAdam directions D (one per target, out x r, float32) for the sketches of the
        backward passes since the last step, scaled so that ‖D·A‖ = update_ratio·‖W‖ over all
        targets; the sketches are consumed. {"directions": None} for a non-finite sketch."""
        if self.prepared:
            raise RuntimeError("LoGRA.propose(): the last proposed step was not applied")
        world = collectives.world_size()
        for t in self.targets:
            if world > 1:  # the batch's sketch: summed over ranks, each rank's loss x world
                collectives.all_reduce(t.s).div_(world)
        sq = sum(t.s.double().square().sum() for t in self.targets)
        self.grad_norm = math.sqrt(sq.item())
        if not math.isfinite(self.grad_norm):
            for t in self.targets:
                t.s.zero_()
                t.backwards = 0
            return {"directions": None}
        tokens = max(int(self.batch_tokens), 1)
        directions = []
        for t in self.targets:
            directions.append(row_adam(t.s / tokens, t.v, self.count + 1, self.beta2,
                                       self.epsilon))
            t.s.zero_()
            t.backwards = 0
        norms = torch.zeros(2, dtype=torch.float64, device=self.targets[0].a.device)
        for t, d in zip(self.targets, directions):
            w = local(t.weight.detach())
            offset, n = row_block(t.weight) if is_sharded(t.weight) else (0, w.shape[0])
            norms[0] += torch.linalg.vector_norm(w, dtype=torch.float64) ** 2
            for start in range(0, n, CHUNK_ROWS):
                u = d[offset + start:offset + min(start + CHUNK_ROWS, n)] @ t.a
                norms[1] += torch.linalg.vector_norm(u, dtype=torch.float64) ** 2
        w_sq, u_sq = collectives.all_reduce(norms).tolist()
        if u_sq > 0:
            factor = self.update_ratio * math.sqrt(w_sq / u_sq)
            for d in directions:
                d.mul_(factor)
        self.prepared = True
        return {"directions": directions}

    @torch.no_grad()
    def apply(self, step: dict, scale: float = 1.0) -> None:
        """W −= (scale·D rounded to the factor dtype)·A for every target, then the count
        advances and, with `refresh`, every A is redrawn (at scale 0 too, as the authors'
        optimizer: the row moments have seen the step's sketch); a step without directions (a
        non-finite sketch) changes nothing."""
        self.prepared = False
        if step["directions"] is None:
            return
        index = self.count if self.refresh else 0  # the update index A was drawn with
        for t, d in zip(self.targets, step["directions"] if scale else []):
            factor = (d * scale).to(self.factor_dtype)
            rows = row_block(t.weight) if is_sharded(t.weight) else None
            subtract_projected_(local(t.weight.data), factor, t.a, rows, CHUNK_ROWS)
            t.applied = (factor, index)
        self.count += 1
        if self.refresh:
            self._draw()

    def _draw(self) -> None:
        """Every A, drawn for the current count (in place: the meter labels them by storage)."""
        for t in self.targets:
            t.a.copy_(projection(self.rank, t.a.shape[1],
                                 projection_seed(self.seed, self.count, t.name),
                                 self.distribution, t.a.device))

    @contextlib.contextmanager
    def perturbed(self, step: dict, eta: float):
        """Forwards inside see θ + η·step: each target's output gets −η·(X·Aᵀ)·Dᵀ added (a
        side branch, no weight copy)."""
        handles = []
        for t, d in zip(self.targets, step["directions"] or []):
            def branch(mod, args, out, a=t.a, d=d * eta):
                x = args[0].to(a.dtype)
                return out - ((x @ a.T) @ d.T).to(out.dtype)
            handles.append(t.module.register_forward_hook(branch))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def tangent(self, step: dict):
        """Inside `torch.autograd.forward_ad.dual_level()`, forwards carry as tangent the
        directional derivative along the step at α = 1: each target's output gets −(X·Aᵀ)·Dᵀ
        added to its tangent (formed in float32 with autocast off, cast to the output's
        dtype), every target at once."""
        handles = []
        for t, d in zip(self.targets, step["directions"] or []):
            def inject(mod, args, out, a=t.a, d=d):
                primal, tangent = fwAD.unpack_dual(out)
                x = fwAD.unpack_dual(args[0]).primal
                with torch.autocast(x.device.type, enabled=False):
                    delta = -((x.float() @ a.T) @ d.T)
                delta = delta.to(primal.dtype)
                return fwAD.make_dual(primal, delta if tangent is None else tangent + delta)
            handles.append(t.module.register_forward_hook(inject))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def dense_gradients(self):
        """For one diagnostic step: the targets require grad, so backward leaves their whole
        gradients in .grad beside the sketches (the forward and the sketches are unchanged;
        autograd keeps each target's input as well); dropped on exit."""
        for t in self.targets:
            t.weight.requires_grad_(True)
        try:
            yield
        finally:
            for t in self.targets:
                t.weight.requires_grad_(False)
                t.weight.grad = None

    # -- sync, state ------------------------------------------------------------------------
    def sync_payload(self) -> dict:
        """Per target the factor α·D of the step applied since the last sync (in
        `update_factor_dtype`) and the seed of the projection it was applied with: the engine
        draws A from the seed (`projection`), so no projection is sent. Call once after each
        apply; a step is never sent twice."""
        lowrank = {}
        for t in self.targets:
            if t.applied is None:
                continue
            factor, index = t.applied
            lowrank[f"{t.name}.weight"] = {
                "side": "projected", "coef": factor, "distribution": self.distribution,
                "seed": projection_seed(self.seed, index, t.name)}
            t.applied = None
        return {"lowrank": lowrank}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        return {n: full(p.detach()) for n, p in self.named}  # FSDP: gathered (collective)

    def unwrap(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def state_tensors(self) -> list[torch.Tensor]:
        """Each target's projection A and row second moment v."""
        return [x for t in self.targets for x in (t.a, t.v)]

    def grad_buffers(self) -> list[torch.Tensor]:
        """The sketches S."""
        return [t.s for t in self.targets]

    def peak_grad_bytes(self) -> int:
        """Analytic: the sketches; no target has a weight gradient, nothing else trains."""
        return tensor_bytes(self.grad_buffers())

    def state_dict(self) -> dict:
        """The options, the update count, the row second moments and the controller's mismatch
        EMA; A is redrawn from the seed and the count. Refused between propose and apply."""
        if self.prepared:
            raise RuntimeError("LoGRA.state_dict(): a proposed step has not been applied")
        return {"config": dict(self.config), "count": self.count,
                "v": {t.name: t.v for t in self.targets},
                "control": self.control.state_dict() if self.control else None}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        saved = state["config"]
        if saved != self.config:
            diff = "; ".join(f"{k}: {saved.get(k)!r} saved, {self.config[k]!r} now"
                             for k in sorted(self.config) if saved.get(k) != self.config[k])
            raise ValueError(f"LoGRA.load_state_dict: a state saved with other options ({diff})")
        for t in self.targets:  # all checked before anything changes
            v = state["v"].get(t.name)
            if not isinstance(v, torch.Tensor) or v.shape != t.v.shape:
                raise ValueError(f"LoGRA.load_state_dict: {t.name}'s row moment is "
                                 f"{tuple(v.shape) if isinstance(v, torch.Tensor) else v!r} in "
                                 f"the state, {tuple(t.v.shape)} here (another model)")
        self.count = state["count"]
        for t in self.targets:
            t.v.copy_(state["v"][t.name])  # in place: the memory meter labels them by storage
            t.s.zero_()
            t.backwards = 0
            t.applied = None
        if self.control:
            self.control.load_state_dict(state["control"])
        if self.refresh:
            self._draw()

    # -- the planner's analytic model (logra/measure/planner.py) -----------------------------------
    @staticmethod
    def has_control(options: dict) -> bool:
        return options.get("controller", True)

    @staticmethod
    def modules(options: dict) -> str:
        return r"\.(" + "|".join(map(re.escape, options.get("target_modules",
                                                            TARGET_MODULES))) + r")$"

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Per target (out x in): the sketch S out·r (grads), v out and A r·in (optimizer), the
        directions D out·r (the step), the applied factor α·D in its dtype, kept for the sync
        (after apply); 256 rows of D·A formed at a time (transient). Every weight in float32 (the
        authors require float32 storage: no separate master copy), no gradient of any weight,
        the base frozen: no activation is kept for a weight's gradient, each target keeps
        X·Aᵀ (tokens x r) instead (`sketch_rank`, logra.measure.activations.activation_breakdown)."""
        f, r = 4, options.get("rank", 256)
        outs = sum(m for m, _ in geo.low_rank)
        widest = max(n for _, n in geo.low_rank)
        factor = 2 if options.get("update_factor_dtype", "bfloat16") == "bfloat16" else 4
        return {"weights": geo.n_all * f, "master": 0, "grads": outs * r * f,
                "optimizer": (outs + r * sum(n for _, n in geo.low_rank)) * f,
                "step": outs * r * f, "perturbed_copy": 0,
                "after_apply": outs * r * factor,  # the applied factors, kept for the sync
                "transient": CHUNK_ROWS * widest * f, "frozen_base": True, "sketch_rank": r,
                # whole on every rank under FSDP: S, v and A, D, the applied factors
                "replicated": ("grads", "optimizer", "step", "after_apply"),
                "jvp_control": options.get("controller", True),
                "jvp_responses": options.get("probe_responses", 2)}

    @staticmethod
    def planned_sync(geo: Geometry, options: dict, b: int) -> int:
        """Per target the factor out·r in `update_factor_dtype` (the projection is drawn by
        the engine from its seed)."""
        r = options.get("rank", 256)
        factor = 2 if options.get("update_factor_dtype", "bfloat16") == "bfloat16" else 4
        return sum(m * r for m, _ in geo.low_rank) * factor

    @staticmethod
    def planned_trained(geo: Geometry, options: dict) -> int:
        """Words the generic transports send: the targets' (nothing else changes)."""
        return geo.n_low


