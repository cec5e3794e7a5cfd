"""LoGRA: Adam in the space of low-rank gradient sketches, with sketch-based policy sync.

For every sketched weight W (m x n; by default every nn.Linear inside the transformer blocks)
the rule keeps a basis Q on the smaller side (logra/sketch.py), an accumulator S for the
gradient's sketch and Adam moments M, V of S's shape. Everything else (embeddings, lm_head,
norms) is trained by dense AdamW (`baselines.dense_adam.DenseAdam` on those parameters).

Gradients are sketched as they are produced: a post-accumulate-grad hook on each sketched weight
adds sketch(G) to S and frees G at once, so full-size gradients of two sketched matrices never
coexist, over micro-batches too (S = Σ sketch(G_i) is exact for a fixed Q).

Update (propose): M, V ← Adam moments of S; the step's coefficient is
C = -lr · α · (√(1-β₂ᵗ) / (1-β₁ᵗ)) · M / (√V + ε), and apply(step, η) does W += η · lift(C)
with one fused addmm. Between refreshes every change of W is exactly rank ≤ r.

Deviations from the textbook / galore-torch, stated:
- Adam is written in galore-torch's form (ε added to √V, bias correction folded into the step
  size), so that `basis="svd", transfer="none"` reproduces GaLoreAdamW's update exactly.
- Refresh: every `refresh_every` updates (and before the first), the new basis is computed in
  the hook from the first micro-batch's gradient of that step (the only full gradient the hook
  ever holds), before it is sketched; with one micro-batch per step that is the step's
  gradient, as in GaLore. GaLore instead needs the step's full gradient. The RL loop shuffles
  sequences across micro-batches, so that micro-batch is a random slice of the batch, not one
  prompt's group; an all-zero gradient (a group with equal rewards) postpones the refresh to
  the next micro-batch.
- Moment transfer on refresh (`transfer="rotate"`, default): with R = Q_newᵀ Q_old (r x r),
  M ← R M (left) / M Rᵀ (right), the first moment expressed in the new basis; the second
  moment, a per-coordinate variance, is carried as V ← (R∘R) V / V (R∘R)ᵀ, which is exact when
  coordinates are independent and keeps V ≥ 0. `transfer="none"` reuses M, V silently, as
  GaLore does.
- No weight decay on sketched weights: decay would make each update full rank and break both
  the rank-r step and the sketch-based sync. Dense parameters use `weight_decay`.
- `grad_norm` is the norm of the sketches plus dense gradients (full gradients are never kept).
- FSDP (logra/distributed.py): each rank holds a row block of W and of its gradient. The basis
  then goes on the column side (`side="right"` whatever the shape): the sketch G_i Q, the moments
  and the step C_i Qᵀ are local to the block, and only the basis needs the other ranks, through
  the range finder's two small all-reduces (logra/sketch.py); every rank gets the same Q, no
  gradient is gathered. Per rank the state is Q (replicated) plus 1/world of S, M, V. The probe's
  side branches and the sync payload gather C (m x r), never W.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field

import torch

from baselines.dense_adam import DenseAdam
from logra.distributed import all_reduce, full, gather_rows, is_sharded, local, row_block
from logra.memory import tensor_bytes
from logra.sketch import BASES, basis, lift_add_, side_of, sketch

DEFAULT_MODULES = r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"
TRANSFERS = ("rotate", "none")
SIDES = ("auto", "left", "right")


def low_rank_linears(model: torch.nn.Module, modules: str) -> list[tuple[str, torch.nn.Linear]]:
    """(name, module) of every trainable nn.Linear whose name matches the regex `modules`:
    the weights LoGRA sketches and GaLore projects."""
    pattern = re.compile(modules)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and pattern.search(name) and m.weight.requires_grad]
    if not found:
        raise ValueError(f"modules: pattern {modules!r} matches no nn.Linear in the model")
    return found


@dataclass
class Sketched:
    """Per-weight state: the weight, its module, side, basis, sketch accumulator, moments."""
    name: str
    param: torch.nn.Parameter
    module: torch.nn.Linear
    side: str
    generator: torch.Generator
    q: torch.Tensor | None = None
    s: torch.Tensor | None = None
    m: torch.Tensor | None = None
    v: torch.Tensor | None = None
    pending_refresh: bool = True
    basis_changed: bool = False
    applied: torch.Tensor | None = field(default=None, repr=False)  # last η·C, for sync


class LoGRA:
    def __init__(self, model: torch.nn.Module, lr: float = 1e-4, rank: int = 8,
                 refresh_every: int = 50, scale: float = 1.0, basis: str = "range",
                 oversample: int = 8, power_iters: int = 1, transfer: str = "rotate",
                 betas=(0.9, 0.999), eps: float = 1e-8, dense_lr: float | None = None,
                 weight_decay: float = 0.0, modules: str = DEFAULT_MODULES, seed: int = 0,
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
        self.basis_method, self.oversample, self.power_iters = basis, oversample, power_iters
        self.transfer, self.betas, self.eps = transfer, tuple(betas), eps
        self.t = 0
        self.grad_norm = float("nan")
        self.sketched: list[Sketched] = []
        for i, (mod_name, mod) in enumerate(low_rank_linears(model, modules)):
            w = mod.weight
            if rank > min(w.shape):
                raise ValueError(f"rank={rank} exceeds min(shape)={min(w.shape)} of "
                                 f"{mod_name}.weight {tuple(w.shape)}")
            gen = torch.Generator().manual_seed(seed * 100_003 + i)
            if is_sharded(w) and (side == "left" or basis != "range"):
                raise ValueError(f"{mod_name}.weight is sharded (FSDP): LoGRA needs side right "
                                 f"and basis range, got side={side!r}, basis={basis!r}")
            w_side = ("right" if is_sharded(w) else
                      side_of(tuple(w.shape)) if side == "auto" else side)
            st = Sketched(f"{mod_name}.weight", w, mod, w_side, gen)
            w.register_post_accumulate_grad_hook(self._hook(st))
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
            if st.pending_refresh:
                nonzero = all_reduce(g.any().float()) if is_sharded(p) else g.any()
                if not nonzero:  # an all-zero gradient spans nothing: refresh on a later one
                    return
                self._refresh(st, g)
            if st.q is not None:
                st.s.add_(sketch(g, st.q, st.side))
        return hook

    def _refresh(self, st: Sketched, g: torch.Tensor) -> None:
        rows = (row_block(st.param)[0], st.param.shape[0]) if is_sharded(st.param) else None
        q_new = basis(g, self.rank, st.side, self.basis_method, self.oversample,
                      self.power_iters, st.generator, rows)
        if st.q is None:
            shape = (self.rank, g.shape[1]) if st.side == "left" else (g.shape[0], self.rank)
            st.s, st.m, st.v = (torch.zeros(shape, device=g.device) for _ in range(3))
        elif self.transfer == "rotate":
            r = q_new.T @ st.q
            if st.side == "left":
                st.m.copy_(r @ st.m)
                st.v.copy_(r.square() @ st.v)
            else:
                st.m.copy_(st.m @ r.T)
                st.v.copy_(st.v @ r.square().T)
        st.q = q_new
        st.pending_refresh = False
        st.basis_changed = True

    # -- the method interface -------------------------------------------------------------------
    @torch.no_grad()
    def propose(self) -> dict:
        b1, b2 = self.betas
        self.t += 1
        step_size = self.lr * math.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        coefs, sq = [], []
        for st in self.sketched:
            if st.s is None:  # no non-zero gradient yet, so no basis: nothing to update
                coefs.append(None)
                continue
            sq.append(st.s.square().sum())
            st.m.mul_(b1).add_(st.s, alpha=1 - b1)
            st.v.mul_(b2).addcmul_(st.s, st.s, value=1 - b2)
            coefs.append((st.m / (st.v.sqrt() + self.eps)).mul_(-step_size * self.scale))
            st.s.zero_()
            st.pending_refresh = self.t % self.refresh_every == 0
        dense = self.dense.propose()
        # one host sync, not one per weight; summed over the ranks' row blocks under FSDP
        sketch_sq = all_reduce(torch.stack(sq).sum()).item() if sq else 0.0
        self.grad_norm = math.sqrt(sketch_sq + self.dense.grad_norm ** 2)
        return {"sketched": coefs, "dense": dense}

    @torch.no_grad()
    def apply(self, step: dict, scale: float = 1.0) -> None:
        for st, c in zip(self.sketched, step["sketched"]):
            if c is not None:
                st.applied = c * scale
                lift_add_(local(st.param.data), st.q, st.applied, st.side)
        self.dense.apply(step["dense"], scale)

    @contextlib.contextmanager
    def perturbed(self, step: dict, eta: float):
        """Forward passes inside compute with θ + η·step: sketched weights through low-rank side
        branches on their Linear outputs (x·lift(ηC)ᵀ, no weight copy), dense parameters
        through the dense rule's exact save-and-restore."""
        handles = []
        for st, c in zip(self.sketched, step["sketched"]):
            if c is None:
                continue

            if is_sharded(st.param):
                c = gather_rows(c, st.param)

            def branch(mod, args, out, q=st.q, c=c * eta, side=st.side):
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
        """Per sketched weight the factors of the step applied since the last sync (basis only
        when it changed); dense parameters in full. Call once after each apply, before the
        next backward (which may refresh the basis); a step is never sent twice."""
        lowrank = {}
        for st in self.sketched:
            if st.applied is None:
                continue
            coef = gather_rows(st.applied, st.param) if is_sharded(st.param) else st.applied
            lowrank[st.name] = {"side": st.side, "coef": coef,
                                "basis": st.q if st.basis_changed else None}
            st.applied, st.basis_changed = None, False
        return {"dense": self.dense.sync_payload()["dense"], "lowrank": lowrank}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        return {st.name: full(st.param.detach()) for st in self.sketched} | \
            self.dense.engine_weights()

    def unwrap(self) -> None:
        pass

    def state_tensors(self) -> list[torch.Tensor]:
        return [t for st in self.sketched for t in (st.q, st.m, st.v)] + \
            self.dense.state_tensors()

    def grad_buffers(self) -> list[torch.Tensor]:
        return [st.s for st in self.sketched]

    def state_dict(self) -> dict:
        """Bases, sketch accumulators, moments, refresh flags and basis-sampling generators.
        Taken after a sync, so no applied step is pending."""
        return {"t": self.t, "dense": self.dense.state_dict(), "sketched": {
            st.name: {"q": st.q, "s": st.s, "m": st.m, "v": st.v,
                      "pending_refresh": st.pending_refresh,
                      "generator": st.generator.get_state()} for st in self.sketched}}

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self.dense.load_state_dict(state["dense"])
        for st in self.sketched:
            s = state["sketched"][st.name]
            st.q, st.s, st.m, st.v = (None if s[k] is None else s[k].to(st.param.device)
                                      for k in ("q", "s", "m", "v"))
            st.pending_refresh = s["pending_refresh"]
            st.generator.set_state(s["generator"])
            # a fresh rollout engine has no bases: the next low-rank sync must carry them
            st.applied, st.basis_changed = None, st.q is not None

    def state_bytes(self) -> int:
        return tensor_bytes(self.state_tensors())

    def peak_grad_bytes(self) -> int:
        """Analytic: dense gradients + the largest sketched gradient (freed in its hook) +
        the sketch accumulators."""
        largest = max(local(st.param).numel() * 4 for st in self.sketched)
        return self.dense.peak_grad_bytes() + largest + tensor_bytes(self.grad_buffers())
