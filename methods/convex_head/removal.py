"""convex_head's removal without a pass over the retained rows: a resident float64
Hessian at an anchor, downdated exactly as rows leave, and a rigorous bound on the gradient
after each Newton step, carried from one request to the next against λβ.

Notation (maths/convex.py): F(Θ; D) = Σ_a (1/m) Σ_{i∈D} ℓ(t_ia θ_a·z_i) + (λ/2)‖Θ‖², ℓ the
logistic loss, ‖z_i‖ ≤ R. A `Resident` holds, for the retained set D (m rows) at the noise-free
Θ₀: a known vector g with ‖∇F(Θ₀; D) − g‖ ≤ b, and an `Anchor`: H̃_a = fl(∇²F_a(θ_A; D)) with
‖H̃_a − ∇²F_a(θ_A; D)‖₂ ≤ e_H, and S̃ = fl((1/m) Σ z_i z_iᵀ) with ‖S̃ − S‖₂ ≤ e_S.

Removing rows K (m' = m − k) is exact algebra on both, O(k·d²) per class:
  ∇F(Θ; D') = (m/m')(∇F(Θ; D) − λΘ) − (1/m') Σ_K ∇ℓ_j(Θ) + λΘ, likewise for ∇²F and S.
A Newton step δ = −H̃⁻¹g then leaves (Taylor with integral remainder)
  ∇F(Θ₀+δ; D') = r + e + (∇²F(θ_A) − H̃)δ + ∫₀¹ (∇²F(Θ₀+tδ) − ∇²F(θ_A)) δ dt,  r = g + H̃δ,
and since |ℓ'''| ≤ c = 1/(6√3), ‖(∇²F_a(θ) − ∇²F_a(θ'))v‖ ≤ c·R·‖θ − θ'‖_S·‖v‖_S
(‖v‖_S² = vᵀSv; Cauchy–Schwarz over the rows), so per class the remainder is at most
  c·R·(‖θ₀ − θ_A‖_S + ½‖δ‖_S)·‖δ‖_S.
This is Guo, Goldstein, Hannun & van der Maaten 2020, Theorem 1 (‖∇L(w⁻)‖ ≤ γ(n−1)‖H⁻¹Δ‖²),
for Lethe's mean objective with the data's second moment in place of the worst case ‖x‖ ≤ 1,
and with the Hessian taken at an anchor rather than at the current point. The new g is r;
b collects every other term and each step's float64 rounding (Higham 2002, §3.1).
When the carried bound runs out, one pass measures the gradient (maths/convex.py) and resets
b; when the anchor has drifted, one more pass rebuilds the Hessian at the current point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from maths import convex
from maths.blocks import ROWS_BYTES

LOGISTIC_THIRD = 1.0 / (6.0 * math.sqrt(3.0))  # max |ℓ'''| of ℓ(u) = log(1 + e^{−u})
U = convex.UNIT_ROUNDOFF


def gamma(m: int) -> float:
    """γ_m = m·u / (1 − m·u): the relative error of an m-term float64 sum or product."""
    return m * U / (1.0 - m * U)


@dataclass(frozen=True)
class Anchor:
    """Exact-up-to-e_H float64 class Hessians at θ_A on the current retained rows, their
    Cholesky factors, and the rows' second moment S̃."""

    theta: torch.Tensor  # (k, d) Θ_A
    H: torch.Tensor  # (k, d, d)
    factor: torch.Tensor  # (k, d, d) Cholesky factors of H
    S: torch.Tensor  # (d, d)
    e_H: float
    e_S: float
    # ≥ Σ_i |z_i| over the retained rows (with room for its rounding), for the gradient's
    # rounding bound; removed rows are subtracted, so it holds nothing of them.
    column_abs: torch.Tensor  # (d,)
    S_norm: float  # ≥ ‖S‖₂ for the exact S: S̃'s trace with its rounding, plus e_S
    # ≥ max ‖z_i‖ over the retained rows, measured (≤ R): rows only leave, so it stays an
    # upper bound; the bounds use it where R was (R = 1000 against rows of norm 6
    # made every allowance 160× too wide)
    rho: float = math.inf


@dataclass(frozen=True)
class Step:
    """What one Newton step's bound was made of (the next step's decisions use it)."""

    residual: float  # ‖r‖: the known part
    carried: float  # the bound carried in (b, rescaled by m/m')
    anchor_mismatch: float  # e_H‖δ‖ + rounding of r
    remainder: float  # the Lipschitz remainder, Σ over classes in quadrature
    drift: float  # its part due to θ₀ ≠ θ_A


@dataclass(frozen=True)
class Rows:
    """The retained rows' float64 (Z, T) and their sample ids, kept with the resident state
    when they fit ROWS_BYTES (100,000 × 257 is 206 MB; a million rows of 256 features stream
    instead): a pass reads them instead of rebuilding each block from the float32 rows, which
    made a pass twice as long at 100,000 × 256. Rows that leave are
    overwritten in place (`without`, O(k) with the id → row index `at`): the removed rows'
    features do not stay in the worker's memory."""

    Z: torch.Tensor  # (m, d) float64, clipped, with the bias coordinate
    T: torch.Tensor  # (m, k) float64 ±1
    ids: torch.Tensor  # (m,) int64 sample ids, row for row
    at: torch.Tensor  # row of sample id `base + i` at [i], −1 for none
    base: int

    @staticmethod
    def fit(m: int, d: int, k: int) -> bool:
        """Whether m rows of d features and k classes fit ROWS_BYTES."""
        return m * (d + k) * 8 <= ROWS_BYTES

    @classmethod
    def of(cls, Z: torch.Tensor, T: torch.Tensor, ids: torch.Tensor) -> Rows:
        """Rows with their index; `ids` distinct (a dataset's sample ids are dense)."""
        base = int(ids.min()) if len(ids) else 0
        size = int(ids.max()) - base + 1 if len(ids) else 0
        at = torch.full((size,), -1, dtype=torch.int64, device=ids.device)
        at[ids - base] = torch.arange(len(ids), device=ids.device)
        return cls(Z, T, ids, at, base)

    def blocks(self) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        size = convex.block_rows(self.Z.device)
        for start in range(0, len(self.Z), size):
            yield self.Z[start : start + size], self.T[start : start + size]

    def with_rows(self, Z: torch.Tensor, T: torch.Tensor, ids: torch.Tensor) -> Rows:
        """These rows joined after the others: new buffers and a new index."""
        return Rows.of(
            torch.cat([self.Z, Z.to(self.Z)]),
            torch.cat([self.T, T.to(self.T)]),
            torch.cat([self.ids, ids.to(self.ids.device)]),
        )

    def without(self, sample_ids: torch.Tensor) -> Rows:
        """These rows gone, in O(k·d): each hole in the first m − k rows takes a live row from
        the last k (order is irrelevant to every sum), then the last k rows are zeroed and cut
        off. The buffers are shared with the previous state, which this supersedes."""
        m = len(self.ids)
        # The index arithmetic is O(k) on the host: on a GPU each masked selection would be a
        # wait for the device; the rows' places are read back once.
        gone = torch.unique(sample_ids.to("cpu", torch.int64))
        offset = gone - self.base
        if bool(((offset < 0) | (offset >= len(self.at))).any()):
            raise ValueError("a removed row is not among the resident rows")
        device = self.ids.device
        at = offset.to(device)
        rows = self.at[at].cpu()
        if bool(((rows < 0) | (rows >= m)).any()):
            raise ValueError("a removed row is not among the resident rows")
        m2 = m - len(gone)
        holes = rows[rows < m2]
        tail = torch.ones(m - m2, dtype=torch.bool)
        tail[rows[rows >= m2] - m2] = False
        movers = (m2 + torch.nonzero(tail).squeeze(1)).to(device)
        holes = holes.to(device)
        self.at[at] = -1
        self.at[self.ids[movers] - self.base] = holes
        for buffer in (self.Z, self.T, self.ids):
            buffer[holes] = buffer[movers]
        self.Z[m2:] = 0.0
        self.T[m2:] = 0.0
        return Rows(self.Z[:m2], self.T[:m2], self.ids[:m2], self.at, self.base)


@dataclass(frozen=True)
class Resident:
    """What convex_head keeps between updates for the retained rows (m of them) at Θ₀."""

    m: int
    theta: torch.Tensor  # (k, d) Θ₀, the noise-free state this describes
    g: torch.Tensor  # (k, d), ‖∇F(Θ₀; D) − g‖ ≤ b
    b: float
    anchor: Anchor
    R: float
    lam: float
    last: Step | None = None
    rows: Rows | None = None  # the rows themselves in float64, when they fit
    # fl(‖g‖), read back with the other scalars of the step that made g (each read is a wait
    # on a GPU); NaN: not known, computed when asked. Every function that sets g sets it.
    g_norm: float = math.nan

    @property
    def known(self) -> float:
        """fl(‖g‖), the bound's known part."""
        return float(torch.linalg.norm(self.g)) if math.isnan(self.g_norm) else self.g_norm

    @property
    def bound(self) -> float:
        """A rigorous upper bound on ‖∇F(Θ₀; D)‖."""
        return self.known + self.b

    def describes(self, theta: torch.Tensor, m: int, R: float, lam: float) -> bool:
        """Whether this is the resident state of `theta` on m rows under (R, λ)."""
        return (
            self.m == m
            and self.R == R
            and self.lam == lam
            and self.theta.shape == theta.shape
            and bool(torch.equal(self.theta, theta.to(self.theta)))
        )


Blocks = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]
"""The retained rows as (Z, T) blocks: clipped float64 features with the bias coordinate and
±1 targets (maths/convex.Problem per block), so no float64 copy of all rows is ever held."""


def anchored(blocks: Blocks, m: int, theta: torch.Tensor, R: float, lam: float) -> Resident:
    """The resident state at Θ on the m retained rows: one Hessian pass (O(m·d²) per class)
    and one gradient pass, both float64, with their rounding bounds."""
    return resident_at(anchor_at(blocks, m, theta, R, lam), blocks, m, theta, R, lam)


def resident_at(
    anchor: Anchor, blocks: Blocks, m: int, theta: torch.Tensor, R: float, lam: float
) -> Resident:
    """The resident state at Θ with `anchor` (made at θ_A, possibly ≠ Θ: the Newton steps'
    bound pays for the drift): the gradient measured in one pass."""
    start = Resident(m, theta.clone(), torch.zeros_like(theta), math.inf, anchor, R, lam)
    return measured(start, blocks)


def anchor_at(blocks: Blocks, m: int, theta: torch.Tensor, R: float, lam: float) -> Anchor:
    """The float64 class Hessians and second moment at θ_A = Θ on the m rows, with their
    rounding bounds e_H and e_S: one pass, O(m·d²) per class."""
    k, d = theta.shape
    H = torch.zeros(k, d, d, dtype=torch.float64, device=theta.device)
    S = torch.zeros(d, d, dtype=torch.float64, device=theta.device)
    column_abs = torch.zeros(d, dtype=torch.float64, device=theta.device)
    weight_error = torch.zeros((), dtype=torch.float64, device=theta.device)
    row_norm = torch.zeros((), dtype=torch.float64, device=theta.device)
    for z, t in blocks():
        if len(z):
            row_norm = torch.maximum(row_norm, torch.linalg.vector_norm(z, dim=1).max())
        u = t * (z @ theta.T)
        w = torch.sigmoid(u) * torch.sigmoid(-u)
        for a in range(k):
            H[a] += (z * w[:, a : a + 1]).T @ z
        S += z.T @ z
        column_abs += z.abs().sum(dim=0)
        # ℓ'' evaluated at a rounded margin: |Δu| ≤ γ_d |z|·|θ|, ℓ'' is c-Lipschitz
        margin_error = gamma(d) * (z.abs() @ theta.abs().T)
        weight_error = torch.maximum(weight_error, (LOGISTIC_THIRD * margin_error).max() + 8 * U)
    eye = lam * torch.eye(d, dtype=torch.float64, device=theta.device)
    H = H / m + eye
    S = S / m
    # |fl(H) − H| ≤ γ_{m+3}·|Z|ᵀW|Z|/m entrywise; that PSD matrix's norm ≤ its trace ≤ ¼ρ².
    factor, info = torch.linalg.cholesky_ex(H)
    read = torch.stack(
        [weight_error, S.diagonal().sum(), (info != 0).any().to(H), row_norm]
    ).tolist()
    if read[2]:
        raise ValueError("the Hessian is not positive definite")
    weight_error_max = read[0]
    rho = _measured_norm(read[3], d, R)
    r2 = rho**2
    e_H = gamma(m + 3) * (0.25 + weight_error_max) * r2 + weight_error_max * r2 + gamma(2) * lam
    e_S = gamma(m + 3) * r2
    column_abs *= 1 + gamma(m)
    return Anchor(theta.clone(), H, factor, S, e_H, e_S, column_abs, _s_norm(read[1], d, e_S), rho)


_SCALARS = ("b", "R", "lam", "g_norm")
_ANCHOR_SCALARS = ("e_H", "e_S", "S_norm", "rho")


def exported(resident: Resident) -> dict[str, torch.Tensor]:
    """The resident state as named float64 tensors (the kept rows left out: a successor reads
    its own), for the process that replaces this one after an erasure (workers/recycle.py):
    rebuilding the anchor there was a Hessian pass, the longest step of its warm-up."""
    A = resident.anchor
    scalar = lambda value: torch.tensor(float(value), dtype=torch.float64)  # noqa: E731
    return {
        "m": torch.tensor(resident.m, dtype=torch.int64),
        "theta": resident.theta,
        "g": resident.g,
        **{name: scalar(getattr(resident, name)) for name in _SCALARS},
        "anchor.theta": A.theta,
        "anchor.H": A.H,
        "anchor.factor": A.factor,
        "anchor.S": A.S,
        "anchor.column_abs": A.column_abs,
        **{f"anchor.{name}": scalar(getattr(A, name)) for name in _ANCHOR_SCALARS},
    }


def imported(tensors: dict[str, torch.Tensor], device: torch.device) -> Resident:
    """`exported`'s tensors as a Resident on `device`, with no rows and no last step."""
    t = {name: value.to(device) for name, value in tensors.items()}
    anchor = Anchor(
        t["anchor.theta"],
        t["anchor.H"],
        t["anchor.factor"],
        t["anchor.S"],
        float(t["anchor.e_H"]),
        float(t["anchor.e_S"]),
        t["anchor.column_abs"],
        float(t["anchor.S_norm"]),
        float(t["anchor.rho"]),
    )
    return Resident(
        m=int(t["m"]),
        theta=t["theta"],
        g=t["g"],
        b=float(t["b"]),
        anchor=anchor,
        R=float(t["R"]),
        lam=float(t["lam"]),
        g_norm=float(t["g_norm"]),
    )


def measured(resident: Resident, blocks: Blocks) -> Resident:
    """The gradient at Θ₀ measured over all retained rows in one float64 pass; b becomes its
    rounding bound, maths/convex.rounding_bound's γ_m·‖(|C| + ¼|Z||Θ|ᵀ)ᵀ|Z|/n + λ|Θ|‖ taken
    per class from what the pass measures: ‖Σ_i |c_ia||z_i|‖ ≤ Σ_i |c_ia|‖z_i‖
    (and ≤ ‖Σ_i |z_i|‖, as |c| ≤ 1), |z_i|·|θ_a| ≤ ρ‖θ_a‖ with ρ the rows' largest norm, and
    Σ|z_i| at most the anchor's (no second product over the rows)."""
    theta, lam = resident.theta, resident.lam
    k, d = theta.shape
    total, rows, sizes = convex.coefficient_sums(blocks(), theta, magnitudes=True)
    assert sizes is not None
    if rows != resident.m:
        raise ValueError("the rows are not the resident state's")
    g = total / rows + lam * theta
    m = rows + d + 3
    anchor = resident.anchor
    theta_norms = torch.linalg.norm(theta, dim=1)
    column = torch.linalg.norm(anchor.column_abs / rows)
    read = torch.cat([sizes, torch.stack([column, torch.linalg.norm(g)]), theta_norms]).tolist()
    weighted, row_norm, column_norm, g_norm = read[:k], read[k], read[k + 1], read[k + 2]
    rho = min(anchor.rho, _measured_norm(row_norm, d, resident.R))
    per_class = [
        min(w * (1 + gamma(rows + 2)) / rows, column_norm) + 0.25 * rho * t * column_norm + lam * t
        for w, t in zip(weighted, read[k + 3 :], strict=True)
    ]
    bound = gamma(m) * math.sqrt(sum(x * x for x in per_class)) * (1 + gamma(m + k))
    anchor = replace(anchor, rho=rho)
    return replace(resident, g=g, b=bound, last=None, g_norm=g_norm, anchor=anchor)


def without(resident: Resident, Z: torch.Tensor, T: torch.Tensor) -> Resident:
    """The resident state once the rows (Z, T) (clipped, with the bias coordinate) leave:
    the gradient at Θ₀, the anchor's Hessians and S downdated exactly, O(k·d²) per class."""
    return _moved(resident, Z, T, -1)


def with_rows(resident: Resident, Z: torch.Tensor, T: torch.Tensor) -> Resident:
    """The resident state once the rows (Z, T) join: the same exact algebra with
    the other sign (m' = m + k), and the same rounding bounds, which sum magnitudes whatever
    the sign; ρ, the rows' largest norm, grows to cover the new rows."""
    return _moved(resident, Z, T, +1)


def _moved(resident: Resident, Z: torch.Tensor, T: torch.Tensor, sign: int) -> Resident:
    """`without` (sign −1) or `with_rows` (+1): ∇F and the anchor's ∇²F and S on
    D' = D ∓ K, from their values on D and the k rows of K alone."""
    k_rows, m = len(Z), resident.m
    m2 = m + sign * k_rows
    if m2 <= 0:
        raise ValueError("every retained row would leave")
    scale, lam, theta = m / m2, resident.lam, resident.theta
    d = theta.shape[1]
    Z_abs = Z.abs()
    # gradient at Θ₀ (the same margins and rounding analysis as convex.rounding_bound)
    coef = -T * torch.sigmoid(-(T * (Z @ theta.T)))
    moved = coef.T @ Z / m2
    g = scale * (resident.g - lam * theta) + (moved if sign > 0 else -moved) + lam * theta
    # |coef| plus the margin's rounding carried through σ (¼-Lipschitz), as in rounding_bound
    coef_abs = coef.abs() + 0.25 * (Z_abs @ theta.abs().T)
    terms = (
        scale * (resident.g.abs() + lam * theta.abs()) + coef_abs.T @ Z_abs / m2 + lam * theta.abs()
    )
    # the anchor's Hessians and second moment
    A = resident.anchor
    u = T * (Z @ A.theta.T)
    w = torch.sigmoid(u) * torch.sigmoid(-u)
    eye = lam * torch.eye(d, dtype=torch.float64, device=Z.device)
    # scale·(H_A − λI) ∓ Σ_j w_ja z_j z_jᵀ/m' + λI, class by class into H itself through one
    # (k, d) buffer: the einsum materialised a (classes, k, d) product first (hundreds of MB for
    # 10,000 rows), which took longer than the products themselves. An entry is w/m' and two
    # products (three roundings) summed with H's own entry over k + 1 terms: within the γ_{k+8} of
    # e_H below.
    data_part = A.H - eye
    H = data_part * scale
    weighted = torch.empty_like(Z)
    for a, H_a in enumerate(H):
        torch.mul(Z, w[:, a : a + 1] / m2, out=weighted)
        H_a.addmm_(Z.T, weighted, alpha=float(sign))
    H.add_(eye)
    weight_error = LOGISTIC_THIRD * gamma(d) * (Z_abs @ A.theta.abs().T) + 8 * U
    # ‖scale·|H_A − λI| + Σ_j w_ja |z_j||z_j|ᵀ/m'‖_F ≤ scale·‖H_A − λI‖_F + Σ_j w_ja‖z_j‖²/m'
    # per class (|·| keeps a Frobenius norm; ‖|z||z|ᵀ‖_F = ‖z‖²): O(k) where the matrix
    # of magnitudes was a second O(k·d²) product per class (half of learning 10,000
    # rows)
    row_squares = (Z * Z).sum(dim=1)
    abs_bound = torch.linalg.matrix_norm(data_part) * scale + (w.T @ row_squares) / m2
    evaluation = (weight_error.max(dim=1).values * row_squares).sum()
    second = Z.T @ Z / m2
    S = scale * A.S + second if sign > 0 else scale * A.S - second
    S_abs = scale * A.S.abs() + Z_abs.T @ Z_abs / m2
    factor, info = torch.linalg.cholesky_ex(H)
    # every scalar the bounds need, read back at once (one wait on a GPU)
    scalars = [
        torch.linalg.norm(terms),
        abs_bound.max() * (1 + gamma(d * d + k_rows + 4)),  # its own rounding
        evaluation,
        torch.linalg.matrix_norm(S_abs),
        S.diagonal().sum(),
        torch.linalg.norm(g),
        (info != 0).any().to(H),
        torch.linalg.vector_norm(Z, dim=1).max() if k_rows else torch.zeros((), dtype=H.dtype),
    ]
    terms_norm, abs_norm, evaluated, S_abs_norm, S_trace, g_norm, failed, row_norm = torch.stack(
        scalars
    ).tolist()
    if failed:  # cannot happen for an exact λ-convex H; be safe
        raise ValueError("the updated Hessian lost positive definiteness")
    b = scale * resident.b + gamma(k_rows + d + 8) * terms_norm
    e_H = scale * A.e_H + gamma(k_rows + 8) * abs_norm + evaluated / m2 + gamma(2) * lam
    e_S = scale * A.e_S + gamma(k_rows + 4) * S_abs_norm
    moved_abs = Z_abs.sum(dim=0)
    column_abs = (A.column_abs + moved_abs if sign > 0 else A.column_abs - moved_abs) + gamma(
        k_rows + 2
    ) * (A.column_abs + moved_abs)
    rho = A.rho  # rows that leave keep it an upper bound; rows that join may raise it
    if sign > 0 and k_rows:
        rho = max(rho, _measured_norm(row_norm, d, resident.R))
    anchor = Anchor(A.theta, H, factor, S, e_H, e_S, column_abs, _s_norm(S_trace, d, e_S), rho)
    return replace(resident, m=m2, g=g, b=b, anchor=anchor, last=None, g_norm=g_norm)


def stale_steps_suffice(before: float, after: float, budget: float, steps_left: int) -> bool:
    """Whether measured Newton steps with the anchor as it is should bring the bound from
    `after` to ≤ `budget` with a step to spare of the `steps_left`, at the rate the last
    measured step showed (after/before): a stale anchor's steps converge linearly, each for
    one gradient pass, where a fresh anchor is a Hessian pass, O(m·d²) per class (some
    twenty gradient passes' worth at 256 features).
    The spare step is the one a re-anchoring needs after it, should the rate slow down. Only
    a choice of work: every step's bound is measured or rigorous whichever way it goes."""
    if after <= budget:
        return True
    if steps_left <= 1 or not 0.0 < after < before:
        return False
    needed = math.ceil(math.log(budget / after) / math.log(after / before))
    return needed < steps_left


def direction(resident: Resident) -> torch.Tensor:
    """The Newton direction −H̃⁻¹g with the anchor's factors."""
    return -torch.cholesky_solve(resident.g.unsqueeze(-1), resident.anchor.factor).squeeze(-1)


def newton_step(
    resident: Resident, alpha: float = 1.0, along: torch.Tensor | None = None
) -> Resident:
    """Θ₁ = Θ₀ − αH̃⁻¹g with the anchor's factors, and the rigorous bound on ‖∇F(Θ₁)‖ (no pass
    over the rows: O(d²) per class given the factors). The bound holds for any step: r below
    is the step's own residual g + H̃δ, whatever δ is."""
    A, lam = resident.anchor, resident.lam
    k, d = resident.theta.shape
    delta = alpha * (along if along is not None else direction(resident))
    theta = resident.theta + delta
    step = theta - resident.theta  # the step as represented: error ≤ u|step| per entry
    Hs = torch.bmm(A.H, step.unsqueeze(-1)).squeeze(-1)
    r = resident.g + Hs
    r_abs = resident.g.abs() + torch.bmm(A.H.abs(), step.abs().unsqueeze(-1)).squeeze(-1)
    R = min(A.rho, _row_norm_bound(resident.R))  # ≥ every retained ‖z_i‖
    h_max = 0.25 * R * R + lam + A.e_H  # ≥ ‖∇²F‖₂ anywhere
    drift_terms = _s_norms(A, resident.theta - A.theta, inflate=U)
    step_terms = _s_norms(A, step, inflate=U)
    per_class = LOGISTIC_THIRD * R * (drift_terms + 0.5 * step_terms) * step_terms
    scalars = [
        torch.linalg.norm(r_abs),
        torch.linalg.norm(step),
        torch.linalg.norm(per_class),
        torch.linalg.norm(LOGISTIC_THIRD * R * drift_terms * step_terms),
        torch.linalg.norm(r),
    ]
    r_abs_norm, step_norm, per_class_norm, drift, residual = torch.stack(scalars).tolist()
    rounding_r = gamma(d + 2) * r_abs_norm
    mismatch = A.e_H * step_norm * (1 + U) + h_max * U * step_norm + rounding_r
    remainder = per_class_norm * (1 + 4 * U)
    carried = resident.b
    b = (carried + mismatch + remainder) * (1 + 8 * U)
    last = Step(residual, carried, mismatch, remainder, drift)
    return replace(resident, theta=theta, g=r, b=b, last=last, g_norm=residual)


def _s_norms(A: Anchor, V: torch.Tensor, inflate: float) -> torch.Tensor:
    """Per class, an upper bound on ‖v‖_S = √(vᵀSv) for the exact S: the float quadratic
    form plus its rounding, plus e_S‖v‖², and the error of v itself (|v|·inflate)."""
    d = V.shape[1]
    quad = ((V @ A.S) * V).sum(dim=1)
    quad_abs = ((V.abs() @ A.S.abs()) * V.abs()).sum(dim=1)
    sq = (V * V).sum(dim=1)
    bound = quad + gamma(2 * d + 4) * quad_abs + A.e_S * sq
    norms = torch.sqrt(bound.clamp(min=0.0)) * (1 + 4 * U)
    return norms + inflate * torch.sqrt(sq) * math.sqrt(A.S_norm) * (1 + 4 * U)


def _s_norm(trace: float, d: int, e_S: float) -> float:
    """≥ ‖S‖₂ for the exact S, from fl(trace S̃) (S is PSD: its norm is at most its trace)."""
    return trace * (1 + gamma(d)) + e_S


def _measured_norm(norm: float, d: int, R: float) -> float:
    """≥ the largest exact ‖z_i‖, from its float64 value (a d-term sum and a square root),
    and never above the clipping bound."""
    return min(norm * (1 + gamma(d + 2)) + 4 * U * norm, _row_norm_bound(R))


def _row_norm_bound(R: float) -> float:
    """R with room for the rounding of the clipping itself (‖z‖ ≤ R(1 + 1e-12))."""
    return R * (1.0 + 1e-12)
