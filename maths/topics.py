"""The anchor-word topic model (Arora et al. 2012, as seed 000 Appendix A uses it) and the
pieces of seed 000's unlearning (Algorithm 1), in float64, with no database.

- `cooccurrence_sum`: S = Σ_d G_d, G_d = (H_d H_dᵀ − diag H_d) / (L_d(L_d − 1)) (eqs 9–13);
  documents with L_d < 2 contribute nothing. Q = S / m, m the documents that contributed.
- `recover_anchors`: rows of Q̄ (Q row-normalised) randomly projected; the farthest row from
  the origin, then greedily the row farthest from the span of those chosen, then one cleanup
  pass (Algorithm 4).
- `recover_topics`: C_i = proj_Δ((Q̄_P Q̄_Pᵀ)⁻¹ Q̄_P Q̄_iᵀ) for every word at once (one r×r
  Cholesky and one batched solve: the Newton step of Algorithm 1 on the squared loss is this
  least-squares solution whatever it starts from, note A.4), A = column-normalised diag(p) C,
  R = A† Q A†ᵀ (Algorithm 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK = 4096  # documents per GEMM when summing co-occurrences


def cooccurrence_sum(counts: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(Σ_d G_d, the number of documents with at least two words), float64."""
    n = counts.shape[1]
    total = torch.zeros(n, n, dtype=torch.float64, device=counts.device)
    used = 0
    for start in range(0, len(counts), CHUNK):
        H = counts[start : start + CHUNK].double()
        length = H.sum(1)
        keep = length >= 2
        H, length = H[keep], length[keep]
        pairs = length * (length - 1)
        scaled = H / pairs.sqrt().unsqueeze(1)
        total += scaled.T @ scaled
        total -= torch.diag((H / pairs.unsqueeze(1)).sum(0))
        used += int(keep.sum())
    return total, used


def normalised_rows(Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q̄, p): Q's rows divided by their sums p (rows of unseen words stay zero)."""
    p = Q.sum(1)
    safe = torch.where(p > 0, p, torch.ones_like(p))
    return Q / safe.unsqueeze(1), p


def recover_anchors(Qbar: torch.Tensor, r: int, dim: int, seed: int) -> list[int]:
    """Algorithm 4: greedy farthest-from-span anchors on a seeded random projection, then a
    cleanup pass that re-chooses each anchor against the span of the others."""
    gen = torch.Generator().manual_seed(seed)
    projection = torch.randn(Qbar.shape[1], dim, generator=gen, dtype=torch.float64)
    X = Qbar @ (projection / math.sqrt(dim)).to(Qbar.device)
    chosen = [int(torch.linalg.norm(X, dim=1).argmax())]
    for _ in range(r - 1):
        chosen.append(_farthest_from_span(X, chosen))
    for k in range(r):
        others = chosen[:k] + chosen[k + 1 :]
        chosen[k] = _farthest_from_span(X, others)
    return chosen


def _farthest_from_span(X: torch.Tensor, rows: list[int]) -> int:
    basis, _ = torch.linalg.qr(X[rows].T)  # dim × |rows|
    residual = X - (X @ basis) @ basis.T
    distance = torch.linalg.norm(residual, dim=1)
    distance[rows] = -1.0
    return int(distance.argmax())


def project_simplex(V: torch.Tensor) -> torch.Tensor:
    """Each row of V projected onto the probability simplex (sort-based, Duchi et al. 2008)."""
    U, _ = torch.sort(V, dim=1, descending=True)
    cumulative = U.cumsum(1) - 1.0
    k = torch.arange(1, V.shape[1] + 1, dtype=V.dtype, device=V.device)
    support = (U - cumulative / k) > 0
    rho = support.to(V.dtype).cumsum(1).argmax(1, keepdim=True)  # last True
    theta = cumulative.gather(1, rho) / (rho + 1).to(V.dtype)
    return torch.clamp(V - theta, min=0.0)


def project_psd(R: torch.Tensor) -> torch.Tensor:
    """The nearest symmetric PSD matrix: symmetrise, clip negative eigenvalues at zero."""
    sym = (R + R.T) / 2
    values, vectors = torch.linalg.eigh(sym)
    return (vectors * values.clamp(min=0.0)) @ vectors.T


@dataclass(frozen=True)
class Topics:
    """A (n × r, columns on the simplex), R (r × r), and what estimates the paper's
    constants: the topic masses (a), the anchor words' weights (p), the anchor simplex's
    robustness (γp)."""

    A: torch.Tensor
    R: torch.Tensor
    topic_mass: torch.Tensor
    anchor_weight: float
    robustness: float


def recover_topics(S: torch.Tensor, m: int, anchors: list[int]) -> Topics:
    """Algorithm 5 with the closed-form least squares (see the module)."""
    Q = S / m
    Qbar, p = normalised_rows(Q)
    P = Qbar[anchors]  # r × n
    gram = P @ P.T
    factor = torch.linalg.cholesky(gram)
    C = project_simplex(torch.cholesky_solve(P @ Qbar.T, factor).T)  # n × r
    weighted = p.unsqueeze(1) * C
    mass = weighted.sum(0)
    A = weighted / mass.clamp(min=1e-300)
    pinv = torch.linalg.pinv(A)
    R = pinv @ Q @ pinv.T
    anchor_weight = float(A[anchors, torch.arange(len(anchors))].min())
    return Topics(A, R, mass, anchor_weight, _robustness(P))


def _robustness(P: torch.Tensor) -> float:
    """min_k of the distance from anchor row k to the span of the others: a lower bound on
    the simplex's robustness (distance to the convex hull), so γp estimated from it is
    conservative."""
    distances = []
    for k in range(len(P)):
        others = torch.cat([P[:k], P[k + 1 :]])
        basis, _ = torch.linalg.qr(others.T)
        residual = P[k] - basis @ (basis.T @ P[k])
        distances.append(float(torch.linalg.norm(residual)))
    return min(distances)


def top_words(A: torch.Tensor, k: int = 10) -> list[list[int]]:
    """Each topic's k most probable words (indices into the vocabulary)."""
    return A.topk(min(k, A.shape[0]), dim=0).indices.T.tolist()


def estimates(topics: Topics) -> dict[str, float]:
    """The paper's constants as the learned model suggests them: a (max/min topic mass), p
    (the smallest anchor weight), γ (the anchor simplex's robustness / p) and q (the smallest
    topic mass, the task rarity when every topic counts)."""
    mass = topics.topic_mass / topics.topic_mass.sum()
    p = max(topics.anchor_weight, 1e-12)
    return {
        "a": float(mass.max() / mass.min().clamp(min=1e-300)),
        "p": p,
        "gamma": topics.robustness / p,
        "q": float(mass.min()),
    }


ESTIMATE_KEYS = ("a", "p", "gamma", "q")


def estimates_tensor(values: dict[str, float]) -> torch.Tensor:
    """The estimates as a float64 tensor (a model state holds tensors only)."""
    return torch.tensor([values[k] for k in ESTIMATE_KEYS], dtype=torch.float64)


def estimates_of(tensor: torch.Tensor) -> dict[str, float]:
    """`estimates_tensor` read back."""
    return dict(zip(ESTIMATE_KEYS, (float(v) for v in tensor.tolist()), strict=True))


def learn(
    counts: torch.Tensor, r: int, projection_dim: int | None, seed: int
) -> tuple[torch.Tensor, int, list[int], Topics]:
    """The anchor-word algorithm end to end: (Σ G_d, documents counted, anchors, topics)."""
    S, m = cooccurrence_sum(counts.flatten(1))
    if m == 0:
        raise ValueError("no training document has two words: nothing to learn from")
    Qbar, _ = normalised_rows(S / m)
    anchors = recover_anchors(Qbar, r, projection_dim or min(Qbar.shape[1], 1000), seed)
    return S, m, anchors, recover_topics(S, m, anchors)


def without(S: torch.Tensor, m: int, removed: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Σ G_d and the document count with these documents subtracted exactly."""
    removed_sum, removed_counted = cooccurrence_sum(removed.flatten(1))
    return S.double() - removed_sum, m - removed_counted
