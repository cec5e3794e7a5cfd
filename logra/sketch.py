"""Low-rank gradient sketches: the side, the basis, sketch and lift for one weight W (m x n).

Side: the basis lives on the smaller dimension. m < n: left basis Q (m x r), sketch S = QᵀG
(r x n), lift(N) = QN. Otherwise right basis Q (n x r), S = GQ (m x r), lift(N) = NQᵀ.
Square matrices take the right side, as galore-torch does, so the two can be compared exactly.

Basis: a randomized range finder (Halko, Martinsson & Tropp 2011, Alg. 4.4 + 5.1): Y = GΩ with
a seeded Gaussian Ω of r + p columns, optional power iterations (re-orthonormalised), then the
top-r left singular vectors of the small projection QₖᵀG rotate Qₖ = orth(Y) onto G's top-r
subspace. Cost O(mn(r + p)). `basis="svd"` takes the top-r singular vectors of a full SVD as
galore-torch does (U[:, :r] on the left, Vh[:r].T on the right), for comparisons on equal terms.
"""
from __future__ import annotations

import torch

BASES = ("range", "svd")


def side_of(shape: tuple[int, int]) -> str:
    """'left' when W has fewer rows than columns, else 'right'."""
    return "left" if shape[0] < shape[1] else "right"


def range_finder(a: torch.Tensor, rank: int, oversample: int, power_iters: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Orthonormal (rows(a) x rank) basis approximating the top-`rank` column space of `a`."""
    k = min(rank + oversample, min(a.shape))
    omega = torch.randn(a.shape[1], k, generator=generator, dtype=a.dtype, device="cpu")
    q = torch.linalg.qr(a @ omega.to(a.device)).Q
    for _ in range(power_iters):
        q = torch.linalg.qr(a.T @ q).Q
        q = torch.linalg.qr(a @ q).Q
    u, _, _ = torch.linalg.svd(q.T @ a, full_matrices=False)
    return q @ u[:, :rank]


def basis(g: torch.Tensor, rank: int, side: str, method: str = "range", oversample: int = 8,
          power_iters: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Basis Q for gradient `g` on `side`: (m x r) on the left, (n x r) on the right."""
    g = g.float()
    if method == "svd":
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        # contiguous copies: a view would keep all of U / Vh alive (and pickled into payloads)
        return (u[:, :rank] if side == "left" else vh[:rank].T).contiguous()
    if method != "range":
        raise ValueError(f"basis: unknown {method!r}; known: {BASES}")
    return range_finder(g if side == "left" else g.T, rank, oversample, power_iters,
                        generator or torch.Generator().manual_seed(0))


def sketch(g: torch.Tensor, q: torch.Tensor, side: str) -> torch.Tensor:
    """S = QᵀG (left) or GQ (right)."""
    return q.T @ g if side == "left" else g @ q


def lift(n: torch.Tensor, q: torch.Tensor, side: str) -> torch.Tensor:
    """Full-size QN (left) or NQᵀ (right)."""
    return q @ n if side == "left" else n @ q.T


def lift_add_(w: torch.Tensor, q: torch.Tensor, coef: torch.Tensor, side: str) -> None:
    """W += lift(coef) in place, without materialising lift(coef) (one fused addmm).

    The trainer and the rollout engine both update weights with this one function on the same
    inputs, so their fp32 copies stay bitwise equal."""
    if side == "left":
        w.addmm_(q.to(w.dtype), coef.to(w.dtype))
    else:
        w.addmm_(coef.to(w.dtype), q.T.to(w.dtype))


def energy_captured(g: torch.Tensor, q: torch.Tensor, side: str) -> float:
    """Fraction of ‖G‖²_F inside the basis: ‖sketch(G)‖² / ‖G‖²."""
    return (sketch(g.float(), q, side).square().sum() / g.float().square().sum()).item()
