"""Sketch-Adam: this project's reconstruction of LoGRA from the paper's abstract, before the
authors published their code (logra/optim/logra_rule.py is theirs). Adam in the space of low-rank
gradient sketches, with sketch-based policy sync; kept as a rule of its own, for the ablations: a
range-finder basis refreshed every T updates, with projected Adam moments, against the authors'
per-update random projections with RowAdam.

For every sketched weight W (m x n; by default every nn.Linear inside the transformer blocks)
the rule keeps a basis Q on the smaller side (logra/optim/sketch.py), an accumulator S for the
gradient's sketch and Adam moments M, V of S's shape; a post-accumulate-grad hook adds sketch(G)
to S and frees G at once. Everything else (embeddings, lm_head, norms) is trained by dense AdamW
(`logra.optim.dense_adam.DenseAdam` on those parameters).

The update, the basis refresh, the moment transfer, the seed, FSDP and each deviation from the
textbook / galore-torch, with the numbers behind them: docs/sketch_adam.md.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from logra.optim.collectives import all_reduce, full, gather_rows, is_sharded, local, row_block
from logra.optim.dense_adam import DenseAdam
from logra.optim.rule import (
    ADAM_OPTIONS,
    DEFAULT_MODULES,
    LR,
    POSINT,
    POSNUM,
    Geometry,
    UpdateRule,
    low_rank_linears,
    tensor_bytes,
)
from logra.optim.sketch import (
    BASES,
    basis,
    lift_add_,
    oversampled,
    range_basis,
    range_sketch,
    side_of,
    sketch,
)

TRANSFERS = ("rotate", "none")
SIDES = ("auto", "left", "right")


@dataclass
class Sketched:
    """Per-weight state: the weight, its module, side, basis, accumulators, moments."""
    name: str
    param: torch.nn.Parameter
    module: torch.nn.Linear
    side: str
    generator: torch.Generator
    s: torch.Tensor  # this step's sketch accumulator
    m: torch.Tensor
    v: torch.Tensor
    t: int = 0  # updates of this weight's moments
    q: torch.Tensor | None = None  # None until the first non-zero gradient
    pending_refresh: bool = False
    y: torch.Tensor | None = None  # range finder's Y (basis "range"), zero between refreshes
    omega_seed: int = 0
    synced_q: torch.Tensor | None = field(default=None, repr=False)  # the engine's basis
    applied: tuple | None = field(default=None, repr=False)  # last (Q, η·C), for sync


class SketchAdam(UpdateRule):
    options = {
        **ADAM_OPTIONS,
        "rank": POSINT | {"description": "sketch rank r (<= the smaller side of every sketched "
                                         "weight)"},
        "refresh_every": POSINT | {"description": "basis refresh gap T, in updates"},
        "scale": POSNUM | {"description": "alpha: the lifted step is multiplied by it"},
        "basis": {"type": "string", "enum": list(BASES)},
        "oversample": {"type": "integer", "minimum": 0, "description": "range finder's "
                       "oversampling p: its single-pass sketch Y has r + p columns"},
        "transfer": {"type": "string", "enum": list(TRANSFERS), "description": "moments on "
                     "refresh: rotated into the new basis, or reused as GaLore does"},
        "side": {"type": "string", "enum": list(SIDES), "description": "where the basis "
                 "lives: auto = the smaller side (the right side, always, when sharded)"},
        "dense_lr": LR | {"description": "lr of the unsketched parameters (default: lr)"},
        "weight_decay": {"type": "number", "minimum": 0, "description": "dense parameters only"},
        "modules": {"type": "string", "description": "regex over module names: the nn.Linear "
                    "modules whose weights are sketched"},
        "seed": {"type": "integer", "minimum": 0, "description": "seed of the range finder's "
                 "random matrices; default: drawn from the run's seed"},
    }
    shardable = True
    transports = ("low_rank", "full", "delta")  # its own: the applied steps' factors

    def __init__(self, model: torch.nn.Module, lr: float = 1e-4, rank: int = 8,
                 refresh_every: int = 50, scale: float = 1.0, basis: str = "range",
                 oversample: int = 8, transfer: str = "rotate",
                 betas=(0.9, 0.999), eps: float = 1e-8, dense_lr: float | None = None,
                 weight_decay: float = 0.0, modules: str = DEFAULT_MODULES,
                 seed: int | None = None,
                 side: str = "auto"):
        if basis not in BASES:
            raise ValueError(f"basis: unknown {basis!r}; known: {BASES}")
        if transfer not in TRANSFERS:
            raise ValueError(f"transfer: unknown {transfer!r}; known: {TRANSFERS}")
        if side not in SIDES:
            raise ValueError(f"side: unknown {side!r}; known: {SIDES}")
        if rank < 1 or refresh_every < 1:
            raise ValueError(f"rank={rank} and refresh_every={refresh_every} must be >= 1")
        self.lr, self.rank, self.refresh_every, self.scale = lr, rank, refresh_every, scale
        self.basis_method, self.oversample = basis, oversample
        self.transfer, self.betas, self.eps = transfer, tuple(betas), eps
        self.t = 0
        self.grad_norm = float("nan")
        if seed is None:  # from the run's seed (see the docstring)
            seed = int(torch.randint(2**31, (1,)))
        self.sketched: list[Sketched] = []
        for i, (mod_name, mod) in enumerate(low_rank_linears(model, modules)):
            w = mod.weight
            if rank > min(w.shape):
                raise ValueError(f"rank={rank} exceeds min(shape)={min(w.shape)} of "
                                 f"{mod_name}.weight {tuple(w.shape)}")
            gen = torch.Generator().manual_seed(seed * 100_003 + i)
            if is_sharded(w) and (side == "left" or basis != "range"):
                raise ValueError(f"{mod_name}.weight is sharded (FSDP): Sketch-Adam needs side right "
                                 f"and basis range, got side={side!r}, basis={basis!r}")
            w_side = ("right" if is_sharded(w) else
                      side_of(tuple(w.shape)) if side == "auto" else side)
            rows, cols = local(w).shape
            shape = (rank, cols) if w_side == "left" else (rows, rank)
            st = Sketched(f"{mod_name}.weight", w, mod, w_side, gen,
                          *(torch.zeros(shape, device=w.device) for _ in range(3)))
            if basis == "range":  # allocated once, as S (see the docstring)
                k = oversampled(rank, oversample, tuple(w.shape), w_side)
                st.y = torch.zeros(w.shape[0 if w_side == "left" else 1], k, device=w.device)
            w.register_post_accumulate_grad_hook(self._hook(st))
            self._schedule_refresh(st)  # the first step needs a basis
            self.sketched.append(st)
        sketched_ids = {id(st.param) for st in self.sketched}
        dense = [(n, p) for n, p in model.named_parameters()
                 if p.requires_grad and id(p) not in sketched_ids]
        self.dense = DenseAdam.for_params(dense, lr=dense_lr or lr, betas=betas, eps=eps,
                                          weight_decay=weight_decay)

    # -- gradients -> sketches ------------------------------------------------------------------
    def _hook(self, st: Sketched):
        @torch.no_grad()
        def hook(p: torch.Tensor) -> None:
            g = local(p.grad).float()
            p.grad = None
            if st.pending_refresh and st.y is not None:  # range: this micro-batch's share of Y
                st.y.add_(range_sketch(g, st.y.shape[1], st.side, st.omega_seed, _rows(p)))
            if st.q is None or (st.pending_refresh and self.basis_method == "svd"):
                flags = torch.stack([g.any(), ~g.isfinite().all()]).float()
                nonzero, nonfinite = (all_reduce(flags) if is_sharded(p) else flags).tolist()
                if not nonzero or nonfinite:  # a zero gradient spans nothing (and adds
                    return  # nothing): the basis comes from a later micro-batch
                if self.basis_method == "svd":
                    self._switch_basis(st, basis(g, self.rank, st.side, "svd"))
                    st.pending_refresh = False
                else:  # the first step's provisional basis: Y so far (see the docstring)
                    y = all_reduce(st.y.clone()) if is_sharded(p) else st.y
                    self._switch_basis(st, self._range_basis(st, y))
            st.s.add_(sketch(g, st.q, st.side))
        return hook

    def _schedule_refresh(self, st: Sketched) -> None:
        """The next step refreshes st's basis (range: with a fresh Ω)."""
        if self.basis_method == "range" and not st.pending_refresh:
            st.omega_seed = int(torch.randint(2**62, (1,), generator=st.generator))
        st.pending_refresh = True

    def _range_basis(self, st: Sketched, y: torch.Tensor) -> torch.Tensor:
        return range_basis(y, self.rank, st.omega_seed,
                           st.param.shape[1 if st.side == "left" else 0])

    def _switch_basis(self, st: Sketched, q_new: torch.Tensor) -> None:
        """Q ← q_new, carrying the moments into it (transfer "rotate", see the docstring)."""
        if st.q is not None and self.transfer == "rotate":
            r = q_new.T @ st.q
            r2 = r.square()
            lost = (1 - r2.sum(1)).clamp_(min=0)  # share of each new direction outside Q_old
            if st.side == "left":
                st.m.copy_(r @ st.m)
                st.v.copy_(r2 @ st.v + lost[:, None] * st.v.mean(0, keepdim=True))
            else:
                st.m.copy_(st.m @ r.T)
                st.v.copy_(st.v @ r2.T + lost[None, :] * st.v.mean(1, keepdim=True))
        st.q = q_new

    # -- the method interface -------------------------------------------------------------------
    @torch.no_grad()
    def propose(self) -> dict:
        sq = [st.s.square().sum() for st in self.sketched if st.q is not None]
        # one host sync, not one per weight; summed over the ranks' row blocks under FSDP
        sketch_sq = all_reduce(torch.stack(sq).sum()).item() if sq else 0.0
        dense = self.dense.propose(skip=not math.isfinite(sketch_sq))
        self.grad_norm = math.sqrt(sketch_sq + self.dense.grad_norm ** 2)
        bases = [st.q for st in self.sketched]
        if not math.isfinite(self.grad_norm):  # skipped: nothing reaches the moments or Y
            for st in self.sketched:
                for buffer in (st.s, st.y):
                    if buffer is not None:
                        buffer.zero_()
            return {"sketched": [None if q is None else torch.full_like(st.s, math.nan)
                                 for st, q in zip(self.sketched, bases)],
                    "bases": bases, "dense": dense}
        self.t += 1
        b1, b2 = self.betas
        coefs = []
        for st in self.sketched:
            if st.q is None:  # no non-zero gradient yet, so no basis: nothing to update
                coefs.append(None)
                continue
            st.t += 1
            st.m.mul_(b1).add_(st.s, alpha=1 - b1)
            st.v.mul_(b2).addcmul_(st.s, st.s, value=1 - b2)
            step_size = self.lr * self.scale * math.sqrt(1 - b2 ** st.t) / (1 - b1 ** st.t)
            coefs.append((st.m / (st.v.sqrt() + self.eps)).mul_(-step_size))
            st.s.zero_()
            if st.pending_refresh and st.y is not None:  # Y has seen the whole batch
                y = all_reduce(st.y) if is_sharded(st.param) else st.y
                if y.any():  # else the refresh stays pending
                    self._switch_basis(st, self._range_basis(st, y))
                    st.pending_refresh = False
                y.zero_()
            if (self.t + 1) % self.refresh_every == 0 and self.basis_method == "range":
                self._schedule_refresh(st)  # the next step's Y: the basis of steps t + 2, ...
            elif self.t % self.refresh_every == 0 and self.basis_method == "svd":
                self._schedule_refresh(st)  # the next step's first micro-batch
        return {"sketched": coefs, "bases": bases, "dense": dense}

    @torch.no_grad()
    def apply(self, step: dict, scale: float = 1.0) -> None:
        """W += scale · lift(C) in the basis the step was formed in; scale 0 (a skipped step)
        changes nothing."""
        if scale != 0:
            for st, q, c in zip(self.sketched, step["bases"], step["sketched"]):
                if c is not None:
                    st.applied = (q, c * scale)
                    lift_add_(local(st.param.data), q, st.applied[1], st.side)
        self.dense.apply(step["dense"], scale)

    @contextlib.contextmanager
    def perturbed(self, step: dict, eta: float):
        """Forward passes inside compute with θ + η·step: sketched weights through low-rank side
        branches on their Linear outputs (x·lift(ηC)ᵀ, no weight copy), dense parameters
        through the dense rule's exact save-and-restore."""
        handles = []
        for st, q, c in zip(self.sketched, step["bases"], step["sketched"]):
            if c is None:
                continue

            if is_sharded(st.param):
                c = gather_rows(c, st.param)

            def branch(mod, args, out, q=q, c=c * eta, side=st.side):
                x = args[0].to(q.dtype)
                delta = (x @ c.T) @ q.T if side == "left" else (x @ q) @ c.T
                return out + delta.to(out.dtype)
            handles.append(st.module.register_forward_hook(branch))
        try:
            with self.dense.perturbed(step["dense"], eta):
                yield
        finally:
            for h in handles:
                h.remove()

    def sync_payload(self) -> dict:
        """Per sketched weight the factors of the step applied since the last sync (its basis
        only when the engine does not hold it yet); dense parameters in full. Call once after
        each apply; a step is never sent twice."""
        lowrank = {}
        for st in self.sketched:
            if st.applied is None:
                continue
            q, coef = st.applied
            coef = gather_rows(coef, st.param) if is_sharded(st.param) else coef
            lowrank[st.name] = {"side": st.side, "coef": coef,
                                "basis": q if q is not st.synced_q else None}
            st.applied, st.synced_q = None, q
        return {"dense": self.dense.sync_payload()["dense"], "lowrank": lowrank}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        return {st.name: full(st.param.detach()) for st in self.sketched} | \
            self.dense.engine_weights()

    def state_tensors(self) -> list[torch.Tensor]:
        return [t for st in self.sketched for t in (st.q, st.m, st.v)] + \
            self.dense.state_tensors()

    def dense_gradients(self):
        raise NotImplementedError("Sketch-Adam's hooks consume each gradient as it is formed")

    def grad_buffers(self) -> list[torch.Tensor]:
        """The sketch accumulators and the range finder's Ys."""
        return [st.s for st in self.sketched] + [st.y for st in self.sketched if st.y is not None]

    def state_dict(self) -> dict:
        """Bases, accumulators, moments, refresh state and basis-sampling generators. Taken
        after a sync, so no applied step is pending."""
        return {"t": self.t, "dense": self.dense.state_dict(), "sketched": {
            st.name: {"q": st.q, "s": st.s, "m": st.m, "v": st.v, "y": st.y, "t": st.t,
                      "pending_refresh": st.pending_refresh, "omega_seed": st.omega_seed,
                      "generator": st.generator.get_state()} for st in self.sketched}}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self.dense.load_state_dict(state["dense"])
        for st in self.sketched:
            s = state["sketched"][st.name]
            for k in ("s", "m", "v", "y"):  # in place: the memory meter labels them by storage
                if getattr(st, k) is not None:
                    getattr(st, k).copy_(s[k])
            st.q = None if s["q"] is None else s["q"].to(st.param.device)
            st.t, st.pending_refresh, st.omega_seed = s["t"], s["pending_refresh"], s["omega_seed"]
            st.generator.set_state(s["generator"])
            # a fresh rollout engine has no bases: the next low-rank sync must carry them
            st.applied, st.synced_q = None, None

    def peak_grad_bytes(self) -> int:
        """Analytic: dense gradients + the largest sketched gradient (freed in its hook) + the
        sketch accumulators and the range finder's Ys."""
        largest = max(local(st.param).numel() * 4 for st in self.sketched)
        return self.dense.peak_grad_bytes() + largest + tensor_bytes(self.grad_buffers())

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Per sketched weight (m x n): moments 2·r·max(m, n) and basis r·min(m, n); gradients:
        the unsketched weights', the largest sketched weight's (freed in its hook), the sketch
        accumulators r·max(m, n) and the range finder's Y, min(m, n)·min(r + p, max(m, n))
        (basis "range"); the step: its coefficients r·max(m, n); `perturbed` copies the
        unsketched weights only; after apply: S and Y and the applied coefficients kept for
        the sync. Unsketched weights: dense Adam's."""
        f, r = 4, options.get("rank", 8)
        k = r + options.get("oversample", 8)
        dense = geo.n_all - geo.n_low
        coefs = sum(r * max(m, n) for m, n in geo.low_rank)
        ys = (sum(min(m, n) * min(k, max(m, n)) for m, n in geo.low_rank)
              if options.get("basis", "range") == "range" else 0)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f else 0,
                "grads": (dense + max(m * n for m, n in geo.low_rank) + coefs + ys) * f,
                "optimizer": (2 * dense + 2 * coefs
                              + sum(r * min(m, n) for m, n in geo.low_rank)) * f,
                "step": coefs * f, "perturbed_copy": dense * f,
                "after_apply": (2 * coefs + ys) * f, "transient": 0, "frozen_base": False}

    @staticmethod
    def planned_sync(geo: Geometry, options: dict, b: int) -> int:
        """The unsketched weights in the policy dtype, the fp32 coefficients r·max(m, n) per
        sketched weight, and its basis r·min(m, n) once per refresh (amortized)."""
        r = options.get("rank", 8)
        return ((geo.n_all - geo.n_low) * b + sum(r * max(m, n) for m, n in geo.low_rank) * 4
                + sum(r * min(m, n) for m, n in geo.low_rank) * 4
                // options.get("refresh_every", 50))


def _rows(p: torch.Tensor) -> tuple[int, int] | None:
    """(first row, total rows) of this rank's block of a sharded weight; None if unsharded."""
    return (row_block(p)[0], p.shape[0]) if is_sharded(p) else None
