"""Lower bounds on ε from one run with canaries (issue 31, first part): Steinke, Nasr and
Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023.

m canaries are each included independently with probability ½; the auditor guesses
"included" or "excluded" for r of them (abstaining on the rest) and is right v times. If the
mechanism is (ε, δ)-DP, the number of right guesses is dominated by a Binomial(r, q) with
q = e^ε / (1 + e^ε), up to a δ term (their Theorem 3):

    p(ε, δ) = P[Bin(r, q) ≥ v] + 2·m·δ · max_{1 ≤ i ≤ v} (1/i) · P[v − i ≤ Bin(r, q) < v]

is a p-value for the hypothesis "the mechanism is (ε, δ)-DP". The audited lower bound at
confidence c is the largest ε that hypothesis test rejects at level 1 − c. No guess can prove
more than the ceiling a perfect attack reaches with m canaries (`perfect_attack_ceiling`).
Nothing here is a point estimate: an "estimated ε" from fitting scores is not a lower bound
and is not computed here."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

MAX_EPSILON = 60.0


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The p-value of v right guesses out of r (of m canaries) under (ε, δ)-DP."""
    if not 0 <= v <= r <= m:
        raise ValueError("need 0 ≤ v ≤ r ≤ m")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError("need ε ≥ 0 and 0 ≤ δ ≤ 1")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Bin(r, q) ≥ v]
    if delta == 0 or v == 0:
        return min(1.0, tail)
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[= v−1], P[= v−2], …, P[= 0]
    worst = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(1.0, tail + 2.0 * m * delta * worst)


def epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 1e-5, confidence: float = 0.95
) -> float:
    """The largest ε whose (ε, δ)-DP hypothesis v right guesses of r reject at `confidence`
    (0 when not even ε = 0 is rejected)."""
    alpha = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    if p_value(m, r, v, MAX_EPSILON, delta) < alpha:
        return MAX_EPSILON
    lo, hi = 0.0, MAX_EPSILON  # p rises with ε: rejected at lo, not rejected at hi
    for _ in range(60):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def perfect_attack_ceiling(m: int, delta: float = 1e-5, confidence: float = 0.95) -> float:
    """The most any attack can prove with m canaries: every guess right, with the best
    number of guesses (abstaining on the rest)."""
    best = 0.0
    r = 1
    while r <= m:
        best = max(best, epsilon_lower_bound(m, r, r, delta, confidence))
        r = r + 1 if r < 64 else int(r * 1.05) + 1
    return max(best, epsilon_lower_bound(m, m, m, delta, confidence))
