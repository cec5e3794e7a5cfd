"""Low-rank gradient sketches: the side, the basis, sketch and lift for one weight W (m x n).

The basis lives on the smaller dimension (square matrices take the right side, as galore-torch
does): a left basis Q (m x r) with sketch S = QᵀG and lift(N) = QN, or a right basis Q (n x r)
with S = GQ and lift(N) = NQᵀ. The basis comes from a one-pass randomized range finder (Halko,
Martinsson & Tropp 2011, Alg. 4.1): Y = AΩ is linear in G, so the sketches of the micro-batches'
gradients add up to the sketch of the batch's and no gradient is needed twice (Ω is drawn again
from its seed wherever it is needed, never stored). Under FSDP the ranks' partial Ys are summed
and every rank gets the same Q. `basis="svd"` takes the top-r singular vectors of a full SVD as
galore-torch does, for comparisons on equal terms.

Beside them, the low-rank arithmetic the trainer and the rollout engine share, so both apply
a step the same way: `subtract_projected_` (LoGRA's W −= D·A) and `lora_merged`.
The range finder, its deviations and its cost: docs/rules.md, "Low-rank gradient sketches".
"""
from __future__ import annotations

import torch

from logra.optim.collectives import all_reduce

BASES = ("range", "svd")


def side_of(shape: tuple[int, int]) -> str:
    """'left' when W has fewer rows than columns, else 'right'."""
    return "left" if shape[0] < shape[1] else "right"


def omega(total: int, k: int, seed: int) -> torch.Tensor:
    """The range finder's Gaussian Ω (total x k), drawn afresh from `seed` on every call."""
    return torch.randn(total, k, generator=torch.Generator().manual_seed(seed))


def range_sketch(g: torch.Tensor, k: int, side: str, seed: int,
                 rows: tuple[int, int] | None = None) -> torch.Tensor:
    """Y = AΩ (A = G on the left, Gᵀ on the right; d x k, d = the basis side's size), with
    Ω = omega(cols(A), k, seed), so Σᵢ range_sketch(Gᵢ) = range_sketch(ΣGᵢ) and Ω is never
    stored. `rows=(offset, total)`: `g` is a row block of a gradient with `total` rows (FSDP,
    right side only): the result is this block's share of Y, to be summed over the ranks."""
    a = g.float() if side == "left" else g.float().T
    offset, total = rows or (0, a.shape[1])
    return a @ omega(total, k, seed)[offset:offset + a.shape[1]].to(a.device)


def range_basis(y: torch.Tensor, rank: int, seed: int, total: int) -> torch.Tensor:
    """Q: the top-`rank` left singular vectors of YΩ⁺ = AΩΩ⁺, the least-squares estimate of A
    from Y (A on span(Ω)), for Y = range_sketch(·, k, ·, seed) of an A with `total` columns.
    YΩ⁺ has the left singular vectors of YL⁻ᵀ (ΩᵀΩ = LLᵀ); float64, all k x k or d x k."""
    om = omega(total, y.shape[1], seed).double()
    chol = torch.linalg.cholesky(om.T @ om)
    z = torch.linalg.solve_triangular(chol, y.double().T.cpu(), upper=False).T
    u = torch.linalg.svd(z, full_matrices=False).U
    return u[:, :rank].to(y.device, y.dtype).contiguous()


def oversampled(rank: int, oversample: int, shape: tuple[int, int], side: str) -> int:
    """k = r + p columns of Ω, at most cols(A) (where YΩ⁺ = A already)."""
    return min(rank + oversample, shape[1] if side == "left" else shape[0])


def basis(g: torch.Tensor, rank: int, side: str, method: str = "range", oversample: int = 8,
          seed: int = 0, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """Basis Q for gradient `g` on `side`: (m x r) on the left, (n x r) on the right.

    `rows=(offset, total)`: `g` is a row block of the gradient, the rest on other ranks (FSDP);
    only the right side's range finder can work on it (one all-reduce of Y)."""
    g = g.float()
    if rows is not None and (side != "right" or method != "range"):
        raise ValueError(f"a row-sharded gradient needs side='right' and basis='range', got "
                         f"side={side!r}, basis={method!r}")
    if method == "svd":
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        # contiguous copies: a view would keep all of U / Vh alive (and pickled into payloads)
        return (u[:, :rank] if side == "left" else vh[:rank].T).contiguous()
    if method != "range":
        raise ValueError(f"basis: unknown {method!r}; known: {BASES}")
    shape = (rows[1], g.shape[1]) if rows else tuple(g.shape)
    y = range_sketch(g, oversampled(rank, oversample, shape, side), side, seed, rows)
    return range_basis(all_reduce(y) if rows else y, rank, seed,
                       shape[1] if side == "left" else shape[0])


def sketch(g: torch.Tensor, q: torch.Tensor, side: str) -> torch.Tensor:
    """S = QᵀG (left) or GQ (right)."""
    return q.T @ g if side == "left" else g @ q


def lift(n: torch.Tensor, q: torch.Tensor, side: str) -> torch.Tensor:
    """Full-size QN (left) or NQᵀ (right)."""
    return q @ n if side == "left" else n @ q.T


def lift_add_(w: torch.Tensor, q: torch.Tensor, coef: torch.Tensor, side: str) -> None:
    """W += lift(coef) in place, without materialising lift(coef) (one fused addmm).

    The trainer and the rollout engine both update weights with this one function on the same
    inputs, so their fp32 copies stay bitwise equal. A bf16 copy (vLLM's) gets W + lift(coef)
    computed in float32 and rounded to bf16 stochastically: a step below bf16's resolution
    (~0.4% of |W|) would round away every time, and is kept on average instead."""
    a, b = (q, coef) if side == "left" else (coef, q.T)
    if w.dtype != torch.bfloat16:
        w.addmm_(a.to(w.dtype), b.to(w.dtype))
        return
    new = w.float().addmm_(a.float(), b.float())
    bits = new.view(torch.int32)
    bits.add_(torch.randint_like(bits, 0, 1 << 16)).bitwise_and_(-(1 << 16))
    w.copy_(bits.view(torch.float32))  # exact: the low 16 bits are zero


def subtract_projected_(w: torch.Tensor, factor: torch.Tensor, projection: torch.Tensor,
                        rows: tuple[int, int] | None = None, chunk: int = 256) -> None:
    """W −= F·A in place, `chunk` rows at a time (LoGRA's update: F the out x r factor, A the
    r x in projection), each chunk's product formed in float32 and subtracted, as the authors'
    optimizer applies it; `rows=(offset, n)`: `w` holds rows offset ... offset + n of the
    weight (an FSDP shard), F all of them. The trainer and the rollout engine both apply
    LoGRA's steps with this one function, so their float32 copies stay bitwise equal; a bf16
    copy (vLLM's) gets the float32 result rounded stochastically, as in `lift_add_`."""
    offset, n = rows or (0, w.shape[0])
    a = projection.float()
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        u = factor[offset + start:offset + stop].float() @ a
        if w.dtype != torch.bfloat16:
            w[start:stop].sub_(u.to(w.dtype))
            continue
        new = w[start:stop].float().sub_(u)
        bits = new.view(torch.int32)
        bits.add_(torch.randint_like(bits, 0, 1 << 16)).bitwise_and_(-(1 << 16))
        w[start:stop].copy_(bits.view(torch.float32))


def energy_captured(g: torch.Tensor, q: torch.Tensor, side: str) -> float:
    """Fraction of ‖G‖²_F inside the basis: ‖sketch(G)‖² / ‖G‖²."""
    return (sketch(g.float(), q, side).square().sum() / g.float().square().sum()).item()


def lora_merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                scale: float) -> torch.Tensor:
    """W_base + (B @ A) · scale, as peft merges an fp32 adapter (`get_delta_weight`)."""
    return base + (b @ a) * scale
