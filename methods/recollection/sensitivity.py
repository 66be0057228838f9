"""Worst-case L2 sensitivity Δ = sup ‖unlearned − retrained‖ of Hessian-free recollection
(seed 003, Theorem 2 / App. Eq. 20), in the un-folded sum of note 003 §5.2: the proof's two
terms added, not the paper's folded (2η²C/(1−q))·ζ whose second term carries a spurious
prefactor. Feed Δ to `app.privacy.gaussian.sigma_for` (the analytic Gaussian), never to the
classical √(2 ln(1.25/δ))/ε formula the paper prints. The method's own accountant (
theorem-specific bounds live with their method; app/privacy keeps the mechanisms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.privacy.validate import PrivacyParameterError, check_finite, check_positive

__all__ = [
    "recollection_rho",
    "recollection_sensitivity",
    "recollection_sensitivity_schedule",
    "recollection_worst_cases",
]


def recollection_rho(eta: float, lam: float, M: float) -> float:
    """Seed 003 Lemma 2: ρ = max{|1 − ηλ|, |1 − ηM|}, the contraction of I − ηH̄ when
    λI ⪯ ∇²ℓ ⪯ MI (λ < 0 for non-convex losses, then ρ > 1)."""
    check_positive("η", eta)
    lam = check_finite("λ", lam)
    M = check_finite("M", M)
    if lam > M:
        raise PrivacyParameterError(f"need λ ≤ M (λI ⪯ ∇²ℓ ⪯ MI), got λ = {lam}, M = {M}")
    return max(abs(1 - eta * lam), abs(1 - eta * M))


def recollection_sensitivity_schedule(
    etas: Sequence[float] | np.ndarray,
    C: float,
    rho: float | Sequence[float],
    removed_steps: Sequence[Sequence[int]] | np.ndarray,
    batch_sizes: float | Sequence[float] | np.ndarray,
) -> float:
    """Seed 003 Theorem 2, un-folded (note 003 §5.2), for any step-size schedule:
    Δ_U = Σ_t Π_{k>t}ρ_k·η_t·2C·Σ_{s<t}η_s + Σ_j Σ_{s∈S(u_j)} Π_{k>s}ρ_k·2C·η_s/|B_s|.

    Arguments (note 003 §1, §5.2):
      etas: η_t, the step size of every training step t = 0..T−1 (T = len(etas)).
      C: the gradient-clipping norm, ‖∇ℓ(w; z)‖ ≤ C (Lemma 1).
      rho: ρ of Lemma 2 (`recollection_rho`, or measured, e.g. by power iteration), either one
        value for all steps or one per step ρ_t; the error of step t is propagated by
        Π_{k=t+1}^{T−1} ρ_k (ρ^{T−1−t} for a constant ρ).
      removed_steps: for each removed sample u_j (m = len(removed_steps)), the global steps
        s = e·B + b(u_j) at which it was in the mini-batch (one per epoch); a list per sample,
        or an (m, epochs) array.
      batch_sizes: |B_s|, the size of the mini-batch of step s (one value or one per step).
    The first term bounds the dropped Taylor remainders (η_t·‖w_t^{-U} − w_t‖, Lemma 1); the
    second the removed samples' gradients taken on w instead of w^{-U} (≤ 2C apart). Nothing
    removed (m = 0) gives exactly 0: then w^{-U} = w and the recollection vector is 0.
    """
    eta = np.asarray(etas, dtype=float)
    if eta.ndim != 1 or eta.size == 0:
        raise PrivacyParameterError("η_t must be a non-empty 1-D schedule")
    if not (np.all(np.isfinite(eta)) and np.all(eta >= 0)):
        raise PrivacyParameterError("every η_t must be finite and ≥ 0")
    T = eta.size
    check_positive("C", C, allow_zero=True)
    try:
        rho_t = np.broadcast_to(np.asarray(rho, dtype=float), (T,))
        sizes = np.broadcast_to(np.asarray(batch_sizes, dtype=float), (T,))
    except ValueError as exc:
        raise PrivacyParameterError("ρ and |B_s| must be one value or one per step") from exc
    if not (np.all(np.isfinite(rho_t)) and np.all(rho_t >= 0)):
        raise PrivacyParameterError("ρ must be finite and ≥ 0")
    if not (np.all(np.isfinite(sizes)) and np.all(sizes >= 1)):
        raise PrivacyParameterError("every batch size |B_s| must be finite and ≥ 1")
    if isinstance(removed_steps, np.ndarray) and removed_steps.ndim == 2:  # (m, epochs)
        steps = removed_steps.astype(int, copy=False).ravel()
    else:
        rows = [np.asarray(used, dtype=int) for used in removed_steps]
        if any(s.ndim != 1 for s in rows):
            raise PrivacyParameterError("the steps of each removed sample must be a 1-D list")
        steps = np.concatenate(rows) if rows else np.empty(0, dtype=int)
    if steps.size and (steps.min() < 0 or steps.max() >= T):
        raise PrivacyParameterError(f"steps of removed samples must lie in [0, {T - 1}]")
    if not len(removed_steps):
        return 0.0
    remainder, per_step = _recollection_terms(eta, C, rho_t, sizes)
    # every removed sample's steps at once (one gather, O(m · epochs)): a step counts once per
    # removed sample in its batch
    return remainder + float(np.sum(per_step[steps]))


def _recollection_terms(
    eta: np.ndarray, C: float, rho_t: np.ndarray, sizes: np.ndarray
) -> tuple[float, np.ndarray]:
    """Theorem 2's first term, and per step s the second term's Π_{k>s}ρ_k·2C·η_s/|B_s|."""
    # Π_{k=t+1}^{T−1} ρ_k through log-space sums: ρ > 1 over many steps gives inf, not an error.
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        prop = np.exp(np.concatenate([np.cumsum(np.log(rho_t)[::-1])[::-1][1:], [0.0]]))

        def propagated(factor: np.ndarray) -> np.ndarray:
            # prop·factor with 0·inf = 0 (a zero term stays zero however far it travels).
            return np.where(factor > 0, prop * factor, 0.0)

        seen = np.concatenate([[0.0], np.cumsum(eta)[:-1]])  # Σ_{s<t} η_s
        remainder = float(np.sum(propagated(eta * 2.0 * C * seen)))
        return remainder, propagated(2.0 * C * eta / sizes)


def recollection_worst_cases(
    etas: np.ndarray, C: float, rho: float, schedule: np.ndarray, batch_sizes: np.ndarray
) -> np.ndarray:
    """Theorem 2 (unfolded) for the worst m of the n training samples, for every m = 0..n:
    the first term plus the m largest per-sample sums of the second. A function of the record
    (schedule, ρ, C) and the count m alone, so a σ calibrated on it does not say which samples
    were removed; entry m bounds `recollection_sensitivity_schedule` for every set
    of m samples. `schedule[e, p]` is the step of epoch e whose batch held position p."""
    eta = np.asarray(etas, dtype=float)
    T = eta.size
    check_positive("C", C, allow_zero=True)
    rho_t = np.broadcast_to(np.asarray(rho, dtype=float), (T,))
    if not (np.all(np.isfinite(rho_t)) and np.all(rho_t >= 0)):
        raise PrivacyParameterError("ρ must be finite and ≥ 0")
    sizes = np.broadcast_to(np.asarray(batch_sizes, dtype=float), (T,))
    remainder, per_step = _recollection_terms(eta, C, rho_t, sizes)
    largest_first = -np.sort(-per_step[schedule].sum(axis=0))
    worst = remainder + np.concatenate([[0.0], np.cumsum(largest_first)])
    worst[0] = 0.0  # nothing removed: w^{-U} = w
    return worst


def recollection_sensitivity(
    eta: float,
    q: float,
    C: float,
    rho: float,
    T: int,
    B: int,
    batch_size: float,
    b_u: Sequence[int],
) -> float:
    """Seed 003 Theorem 2 (App. Eq. 20) un-folded (note 003 §5.2), geometric decay η_t = ηq^t:
    Δ_U = (2η²C/(1−q))[(ρ^T−q^T)/(ρ−q) − (ρ^T−q^{2T})/(ρ−q²)]
          + Σ_j (2Cη/|B|)·(ρ^T−q^T)/(ρ^B−q^B)·ρ^{B−b(u_j)−1}·q^{b(u_j)}.

    Arguments: eta = η (= η_0), q the per-step decay (0 < q ≤ 1), C the gradient clip, rho = ρ
    (Lemma 2, e.g. `recollection_rho(η, λ, M)`), T the total number of SGD steps ((E+1)·B),
    B the number of mini-batches per epoch, batch_size = |B| the mini-batch size, b_u the batch
    index b(u_j) ∈ [0, B) at which each removed sample is used (the same in every epoch, as in
    the paper); m = len(b_u). Summed term by term (no 0/0 at ρ = q, q², q = 1).
    """
    check_positive("η", eta)
    if not (isinstance(q, int | float) and math.isfinite(q) and 0 < q <= 1):
        raise PrivacyParameterError(f"q must be in (0, 1], got {q!r}")
    for name, v in (("T", T), ("B", B)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise PrivacyParameterError(f"{name} must be an integer ≥ 1, got {v!r}")
    if T % B:
        raise PrivacyParameterError(f"T = {T} must be a whole number of epochs of B = {B} steps")
    positions = list(b_u)
    if any(isinstance(b, bool) or not isinstance(b, int | np.integer) for b in positions) or any(
        not 0 <= b < B for b in positions
    ):
        raise PrivacyParameterError(f"every b(u) must be an integer in [0, {B - 1}]")
    check_positive("ρ", rho, allow_zero=True)
    etas = eta * q ** np.arange(T, dtype=float)
    removed = [np.arange(b, T, B) for b in positions]
    return recollection_sensitivity_schedule(
        etas.tolist(), C, rho, [r.tolist() for r in removed], batch_size
    )
