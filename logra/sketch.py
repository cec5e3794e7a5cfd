"""Low-rank gradient sketches: the side, the basis, sketch and lift for one weight W (m x n).

Side: the basis lives on the smaller dimension. m < n: left basis Q (m x r), sketch S = QᵀG
(r x n), lift(N) = QN. Otherwise right basis Q (n x r), S = GQ (m x r), lift(N) = NQᵀ.
Square matrices take the right side, as galore-torch does, so the two can be compared exactly.

Basis: a randomized range finder (Halko, Martinsson & Tropp 2011, Alg. 4.4 + 5.1): Y = GΩ with
a seeded Gaussian Ω of r + p columns, optional power iterations (re-orthonormalised), then the
top-r left singular vectors of the small projection QₖᵀG rotate Qₖ = orth(Y) onto G's top-r
subspace. Cost O(mn(r + p)). Deviation, so that the same code runs on a row-sharded gradient
(FSDP): a power iteration orthonormalises (GGᵀ)Q once rather than GᵀQ and then G(·), and the
final rotation takes the eigenvectors of the k x k Gram matrix (QₖᵀG)(QₖᵀG)ᵀ (float64) rather
than an SVD of QₖᵀG; both span the same subspaces. `basis="svd"` takes the top-r singular
vectors of a full SVD as galore-torch does (U[:, :r] on the left, Vh[:r].T on the right), for
comparisons on equal terms.
"""
from __future__ import annotations

import torch

from logra.distributed import all_reduce

BASES = ("range", "svd")


def side_of(shape: tuple[int, int]) -> str:
    """'left' when W has fewer rows than columns, else 'right'."""
    return "left" if shape[0] < shape[1] else "right"


def range_finder(a: torch.Tensor, rank: int, oversample: int, power_iters: int,
                 generator: torch.Generator, cols: tuple[int, int] | None = None) -> torch.Tensor:
    """Orthonormal (rows(a) x rank) basis approximating the top-`rank` column space of `a`.

    `a` may be the column block [offset, offset + a.shape[1]) of a matrix with `total` columns
    whose other blocks live on other ranks (`cols=(offset, total)`, FSDP): every product that
    sums over the columns is then all-reduced (sizes rows x k and k x k), each rank draws the
    same Ω and keeps its rows, and every rank ends with the same basis; A is never gathered."""
    reduce = all_reduce if cols else (lambda t: t)
    offset, total = cols or (0, a.shape[1])
    k = min(rank + oversample, a.shape[0], total)
    omega = torch.randn(total, k, generator=generator, dtype=a.dtype, device="cpu")
    q = torch.linalg.qr(reduce(a @ omega[offset:offset + a.shape[1]].to(a.device))).Q
    for _ in range(power_iters):  # the span of (AAᵀ)Q, re-orthonormalised
        q = torch.linalg.qr(reduce(a @ (a.T @ q))).Q
    # rotate onto the top-r left singular vectors of B = QᵀA: eigenvectors of BBᵀ (k x k, in
    # float64, so the squared spectrum loses nothing that matters at rank r)
    b = (q.T @ a).double()
    _, u = torch.linalg.eigh(reduce(b @ b.T))
    return q @ u[:, -rank:].flip(-1).to(q.dtype)


def basis(g: torch.Tensor, rank: int, side: str, method: str = "range", oversample: int = 8,
          power_iters: int = 1, generator: torch.Generator | None = None,
          rows: tuple[int, int] | None = None) -> torch.Tensor:
    """Basis Q for gradient `g` on `side`: (m x r) on the left, (n x r) on the right.

    `rows=(offset, total)`: `g` is a row block of the gradient, the rest on other ranks (FSDP);
    only the right side's range finder can work on it (see `range_finder`)."""
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
    return range_finder(g if side == "left" else g.T, rank, oversample, power_iters,
                        generator or torch.Generator().manual_seed(0), cols=rows)


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


def energy_captured(g: torch.Tensor, q: torch.Tensor, side: str) -> float:
    """Fraction of ‖G‖²_F inside the basis: ‖sketch(G)‖² / ‖G‖²."""
    return (sketch(g.float(), q, side).square().sum() / g.float().square().sum()).item()
