"""Lower bounds on ε from one run with canaries: Steinke, Nasr and
Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023.

m canaries are each included independently with probability ½; the auditor guesses
"included" or "excluded" for r of them (abstaining on the rest) and is right v times. If the
mechanism is (ε, δ)-DP, the number of right guesses is dominated by a Binomial(r, q) with
q = e^ε / (1 + e^ε), up to a δ term (their Theorem 3):

    p(ε, δ) = P[Bin(r, q) ≥ v] + 2·m·δ · max_{1 ≤ i ≤ v} (1/i) · P[v − i ≤ Bin(r, q) < v]

is a p-value for the hypothesis "the mechanism is (ε, δ)-DP". The audited lower bound at
confidence c is the largest ε that hypothesis test rejects at level 1 − c. No guess can prove
more than the ceiling a perfect attack reaches with m canaries (`perfect_attack_ceiling`).

The f-DP bound (Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy in One Run",
2024) tests the stronger hypothesis "the mechanism is μ-GDP" (its trade-off curve is the
Gaussian one, `fdp_rejects`), with μ the GDP parameter whose (ε, δ) curve passes through the
claimed (ε, δ); for a Gaussian-noise release that is the release's own curve, and its bound is
tighter than the one-run bound's. For a mechanism whose trade-off is not Gaussian it is a
figure about the Gaussian hypothesis only, and Lethe's verdicts use the one-run bound.

`audit_scores` turns canary scores and inclusion bits into both bounds: a fixed grid of guess
rules (how many guesses, one-sided or two-sided), every rule tested at level (1 − c)/rules
(Bonferroni), so picking the best rule after seeing the scores keeps the confidence.
Nothing here is a point estimate: an "estimated ε" from fitting scores is not a lower bound
and is not computed here.

**The joint test** (`joint_bound`, the audit's primary verdict) tests what a
certificate claims rather than what it implies per canary. Lethe's certificate says every
release R(b), whatever the canaries' bits b, is (ε, δ)-close to one release R₀ that does not
depend on b (the retrain without any canary). For any statistic T(R, b) fixed in advance,
P[T(R(b), b) ≥ t] = E_b P[R(b) ∈ E_b] ≤ e^ε·E_b P[R₀ ∈ E_b] + δ = e^ε·p₀(t) + δ, where p₀ is
T's distribution when the bits are independent of the release: exactly Bin(r, ½) for the
right guesses of a rule of r guesses, and for the AUC its distribution over random
permutations of the observed bits, estimated by Monte Carlo with a valid p-value
(1 + #{T* ≥ t}) / (N + 1). Both stay exact when the release depends on the bits through their
count alone (a σ calibrated for removing the Σb included canaries, goal 5): given the count,
which canaries are in is uniformly random and independent of the release, so a rule's right
guesses are hypergeometric given the count, Bin(r, ½) over it, and the AUC's permutation
null is its conditional law. So e^ε·p₀ + δ is a
p-value for "the certificate holds"; at level α over K statistics (Bonferroni) the audit
proves ε ≥ ln((α/K − δ) / p₀) for each, and its bound is the largest. With δ counted once and
no factor 2, 1,000 right guesses of 1,000 can show ε up to ≈ 688 (the per-canary test's
ceiling is about 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import special, stats

from app.privacy.gaussian import sigma_for

MAX_EPSILON = 60.0
BISECTIONS = 30  # ε to within 60 / 2³⁰ ≈ 6e-8, rounded down (a lower bound stays one)


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
    for _ in range(BISECTIONS):
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


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ of the μ-GDP mechanism that is exactly (ε, δ)-DP at this δ (Dong, Roth & Su 2022,
    Cor. 2.13: a Gaussian mechanism with σ/Δ = 1/μ), from the analytic Gaussian σ."""
    if epsilon <= 0:
        return 0.0
    return 1.0 / sigma_for(1.0, epsilon, delta)


def fdp_rejects(m: int, r: int, v: int, mu: float, alpha: float) -> bool:
    """Whether v right guesses of r (of m canaries) reject "μ-GDP" at level α: Mahloujifar et
    al. 2024's recursion bounding the probability of v or more right guesses under an f-DP
    mechanism, with f the Gaussian trade-off f(x) = Φ(Φ⁻¹(1 − x) − μ), written through the
    inverse of its blow-up x ↦ Φ(Φ⁻¹(x) − μ)."""
    if not 0 <= v <= r <= m:
        raise ValueError("need 0 ≤ v ≤ r ≤ m")
    if v == 0:
        return False
    right, wrong = alpha * v / m, alpha * (r - v) / m  # the masses the bound tracks
    for i in range(v - 1, -1, -1):
        raised = max(wrong, float(special.ndtr(special.ndtri(right) - mu)))
        if raised == wrong:  # neither mass can change again
            break
        right = min(right + i / (r - i) * (raised - wrong), 1.0)
        wrong = raised
    return right + wrong > r / m


def fdp_epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 1e-5, confidence: float = 0.95
) -> float:
    """The largest ε whose Gaussian f-DP hypothesis (μ from (ε, δ)) v right guesses of r
    reject at `confidence` (0 when not even ε → 0 is rejected)."""
    alpha = 1.0 - confidence
    if not fdp_rejects(m, r, v, gaussian_mu(1e-9, delta), alpha):
        return 0.0
    if fdp_rejects(m, r, v, gaussian_mu(MAX_EPSILON, delta), alpha):
        return MAX_EPSILON
    lo, hi = 0.0, MAX_EPSILON  # rejection gets harder as ε (so μ) grows
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if fdp_rejects(m, r, v, gaussian_mu(mid, delta), alpha):
            lo = mid
        else:
            hi = mid
    return lo


GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # one-sided: up to ½ (about all in)


@dataclass(frozen=True)
class GuessRule:
    """Guess "included" for the `positive` highest scores and "excluded" for the `negative`
    lowest; abstain on the rest."""

    positive: int
    negative: int

    @property
    def guesses(self) -> int:
        return self.positive + self.negative


def guess_rules(m: int) -> list[GuessRule]:
    """The fixed grid every audit tests: each fraction of the canaries guessed one-sided
    (only "included") and two-sided (half each way)."""
    rules: list[GuessRule] = []
    for f in GUESS_FRACTIONS:
        r = max(2, min(m, round(m * f)))
        for rule in (GuessRule(r, 0), GuessRule(r - r // 2, r // 2)):
            if rule not in rules and (rule.negative or f <= 0.5):
                rules.append(rule)
    return rules


@dataclass(frozen=True)
class Bound:
    """One lower bound: ε, and the guess rule that proved it with its counts."""

    epsilon: float
    rule: GuessRule | None
    guesses: int
    right: int


@dataclass(frozen=True)
class AuditBounds:
    """What one run's canary scores prove, and the most they could have proved: the joint
    test of the certificate's own (ε, δ) (primary), and the per-canary bounds (secondary)."""

    one_run: Bound
    fdp: Bound
    ceiling_one_run: float
    ceiling_fdp: float
    auc: float
    rules_tested: int
    joint: JointBound | None = None


def right_guesses(scores: np.ndarray, included: np.ndarray, rule: GuessRule) -> int:
    """How many of a rule's guesses are right (ties broken by position, a fixed order)."""
    order = np.argsort(-scores, kind="stable")
    top, bottom = order[: rule.positive], order[len(order) - rule.negative :]
    return int(included[top].sum()) + int((~included[bottom]).sum())


def audit_scores(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    joint_delta: float | None = None,
    rng: np.random.Generator | None = None,
    shift: float | None = None,
) -> AuditBounds:
    """The lower bounds from one run: higher scores should mean "included". The joint test
    at the certificate's δ (`joint_delta`); the per-canary bounds at `delta` (δ′), every
    rule of the grid tested at the Bonferroni level, the best kept, their ceilings the same
    audit of a perfect attack (scores that are the bits themselves). A δ′ of 1 (a large ε's
    (1 + e^ε)·δ) proves nothing per canary: those bounds are 0, not an error."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if m < 2 or included.shape != scores.shape:
        raise ValueError("need at least two scores, one inclusion bit each")
    bad = int((~np.isfinite(scores)).sum())
    if bad:
        raise ValueError(
            f"{bad} of {m} canary scores are not finite: the scored weights overflow the "
            "score (a release drowned in noise does; see its σ)"
        )
    rules = guess_rules(m)
    joint = joint_bound(
        scores,
        included,
        delta if joint_delta is None else joint_delta,
        confidence,
        rng,
        shift=shift if shift is not None and math.isfinite(shift) else None,
    )
    if not 0 <= delta < 1:
        nothing = Bound(0.0, None, 0, 0)
        return AuditBounds(nothing, nothing, 0.0, 0.0, auc(scores, included), len(rules), joint)
    level = 1.0 - (1.0 - confidence) / len(rules)
    one_run, fdp = _best(scores, included, rules, delta, level)
    perfect = _best(included.astype(np.float64), included, rules, delta, level)
    return AuditBounds(
        one_run,
        fdp,
        perfect[0].epsilon,
        perfect[1].epsilon,
        auc(scores, included),
        len(rules),
        joint,
    )


def _best(
    scores: np.ndarray, included: np.ndarray, rules: list[GuessRule], delta: float, level: float
) -> tuple[Bound, Bound]:
    """The highest one-run and f-DP bounds any rule proves at `level`."""
    m = len(scores)
    one_run, fdp = Bound(0.0, None, 0, 0), Bound(0.0, None, 0, 0)
    for rule in rules:
        r, v = rule.guesses, right_guesses(scores, included, rule)
        eps = _one_run_cached(m, r, v, delta, level)
        if eps > one_run.epsilon:
            one_run = Bound(eps, rule, r, v)
        eps = _fdp_cached(m, r, v, delta, level)
        if eps > fdp.epsilon:
            fdp = Bound(eps, rule, r, v)
    return one_run, fdp


@lru_cache(maxsize=4096)
def _one_run_cached(m: int, r: int, v: int, delta: float, level: float) -> float:
    return epsilon_lower_bound(m, r, v, delta, level)


@lru_cache(maxsize=4096)
def _fdp_cached(m: int, r: int, v: int, delta: float, level: float) -> float:
    return fdp_epsilon_lower_bound(m, r, v, delta, level)


def auc(scores: np.ndarray, included: np.ndarray) -> float:
    """The area under the ROC curve of "higher score ⇒ included" (0.5: no signal), ties
    counted half (the Mann–Whitney statistic)."""
    n_in, n_out = int(included.sum()), int((~included).sum())
    if n_in == 0 or n_out == 0:
        return 0.5
    ranks = stats.rankdata(scores)
    return float((ranks[included].sum() - n_in * (n_in + 1) / 2) / (n_in * n_out))


def implied_per_canary(epsilon: float, delta: float) -> tuple[float, float]:
    """The (ε', δ') a certificate of (ε, δ) implies for one canary's inclusion bit in Lethe's
    audit (README, "Auditing a certificate"): every release is (ε, δ)-close to the one
    retrained without all removed canaries, which is the same release whatever the bits, so
    any two bit vectors give (2ε, (1 + e^ε)·δ) (the triangle through that common release)."""
    return 2.0 * epsilon, min(1.0, (1.0 + math.exp(epsilon)) * delta)


PERMUTATIONS = 20_000  # permutations of the bits for the AUC's Monte Carlo null


@dataclass(frozen=True)
class JointBound:
    """The joint test's result: the lower bound on the certificate's own ε, the statistic
    that proved it with its null p-value (log, natural), and the most any attack with these
    canaries could prove (every guess of the largest rule right)."""

    epsilon: float
    statistic: str
    log_p_null: float
    ceiling: float
    statistics: int
    level: float  # each count statistic's level: α / K, or α / 2(K − 1) beside the shift


SHIFT_SHARE = 0.5  # of α, the joint shift's where it applies: the most powerful on noisy releases


def joint_bound(
    scores: np.ndarray,
    included: np.ndarray,
    delta: float,
    confidence: float = 0.95,
    rng: np.random.Generator | None = None,
    permutations: int = PERMUTATIONS,
    shift: float | None = None,
) -> JointBound:
    """The joint test of (module docstring): every rule of the grid's right guesses (exact
    binomial null) and the AUC (`auc_log_p_value`), each at α/K; where the release has
    Gaussian noise and a reference (`shift`, the joint-shift z: `joint_shift_log_p`), that
    statistic at SHIFT_SHARE·α and the others share the rest (fixed before the scores)."""
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    rules = guess_rules(m)
    alpha = 1.0 - confidence
    k = len(rules) + 1 + (shift is not None)
    counted = alpha * (1.0 - SHIFT_SHARE if shift is not None else 1.0)
    level = counted / (len(rules) + 1)
    if level <= delta:  # δ alone is above every statistic's level: nothing can be rejected
        return JointBound(0.0, "none", 0.0, 0.0, k, level)
    room = math.log(level - delta)
    best, name, log_p = 0.0, "none", 0.0
    for rule in rules:
        r, v = rule.guesses, right_guesses(scores, included, rule)
        lp = log_binomial_tail(r, v)
        if room - lp > best:
            best, name, log_p = room - lp, f"right guesses {v} of {r} ({_rule_name(rule)})", lp
    generator = rng if rng is not None else np.random.default_rng()
    lp = auc_log_p_value(scores, included, generator, permutations)
    if room - lp > best:
        best, name, log_p = room - lp, f"AUC {auc(scores, included):.3f}", lp
    if shift is not None:
        lp = joint_shift_log_p(shift)
        shift_room = math.log(alpha * SHIFT_SHARE - delta)
        if shift_room - lp > best:
            best, name, log_p = shift_room - lp, f"joint shift z = {shift:.2f}", lp
    ceiling = max(room + rule.guesses * math.log(2.0) for rule in rules)
    return JointBound(best, name, log_p, ceiling, k, level)


def joint_shift_log_p(z: float) -> float:
    """ln P[N(0, 1) ≥ z]: the joint-shift statistic's null. Under the certificate's reference
    the release is Θ_ref + N(0, σ²I), so its offset from Θ_ref projected on any direction v
    fixed by Θ_ref and the bits, over σ‖v‖, is exactly N(0, 1) (Mahloujifar et al. 2024 and
    "Let's Ask Gauss" for canary-aligned sums; workers/privacy_audit.py `joint_shift`)."""
    return float(special.log_ndtr(-z))


def auc_log_p_value(
    scores: np.ndarray, included: np.ndarray, rng: np.random.Generator, permutations: int
) -> float:
    """ln of a p-value for the AUC under random permutation of the bits: twice the smaller
    of the Monte Carlo p-value (at least 1/(N + 1)) and Serfling's bound (`auc_log_tail`,
    no floor), so strong signals are not capped by the number of permutations. Twice the
    minimum of two valid p-values is one (a union bound)."""
    monte_carlo = math.log(auc_p_value(scores, included, rng, permutations))
    return min(0.0, math.log(2.0) + min(monte_carlo, auc_log_tail(scores, included)))


def auc_log_tail(scores: np.ndarray, included: np.ndarray) -> float:
    """ln of an upper bound on P[AUC* ≥ AUC] over random permutations of the bits. The AUC
    is affine in the included rows' mean (mid)rank, AUC − ½ = (mean − (N + 1)/2)/n_out, and
    that mean is of n_in ranks drawn without replacement from the N in [a, b]; Serfling
    (1974, Corollary 1.1): P[mean − μ ≥ t] ≤ exp(−2nt² / ((1 − (n − 1)/N)(b − a)²)). The
    excluded rows' mean, its mirror, gives a second bound of the same event; the smaller
    holds."""
    included = np.asarray(included, dtype=bool)
    n_in, n = int(included.sum()), len(included)
    n_out = n - n_in
    if n_in == 0 or n_out == 0:
        return 0.0
    excess = auc(scores, included) - 0.5
    ranks = stats.rankdata(scores)
    spread = float(ranks.max() - ranks.min())
    if excess <= 0 or spread <= 0:
        return 0.0

    def bound(drawn: int, other: int) -> float:
        t = other * excess  # the drawn rows' mean rank above (N + 1)/2
        return -2.0 * drawn * t * t / ((1.0 - (drawn - 1) / n) * spread * spread)

    return min(0.0, bound(n_in, n_out), bound(n_out, n_in))


def auc_ceiling(m: int, delta: float, confidence: float = 0.95, statistics: int = 15) -> float:
    """The most the AUC can prove in the joint test with m canaries half included: a perfect
    ranking of distinct scores, its Serfling tail (twice it, as `auc_log_p_value`) at α/K."""
    scores = np.arange(m, dtype=np.float64)
    included = scores >= m - m // 2
    level = (1.0 - confidence) / statistics
    if level <= delta:
        return 0.0
    log_p = min(0.0, math.log(2.0) + auc_log_tail(scores, included))
    return math.log(level - delta) - log_p


def log_binomial_tail(r: int, v: int) -> float:
    """ln P[Bin(r, ½) ≥ v], summed in log space from the terms' logarithms (scipy's logsf
    returns -inf below about 2^-1075)."""
    if v <= 0:
        return 0.0
    if v > r:
        return -math.inf
    return float(special.logsumexp(stats.binom.logpmf(np.arange(v, r + 1), r, 0.5)))


def auc_p_value(
    scores: np.ndarray, included: np.ndarray, rng: np.random.Generator, permutations: int
) -> float:
    """P[AUC(permuted bits) ≥ AUC(bits)] over `permutations` random permutations of the
    observed bits (their count kept), as a valid p-value: (1 + #{≥}) / (N + 1). Valid when
    the release depends on the bits at most through their count (a σ
    calibrated for removing the included canaries): given the count, every arrangement of
    the bits is equally likely and independent of the scores. Ranks are computed once; each
    permutation is a rank sum."""
    m = len(scores)
    ranks = stats.rankdata(scores)
    observed = auc(scores, included)
    n_in = int(included.sum())
    n_out = m - n_in
    if n_in == 0 or n_out == 0:
        return 1.0
    at_least = 0
    block = 1000
    for start in range(0, permutations, block):
        size = min(block, permutations - start)
        # n_in positions drawn without replacement per row: the first n_in of a random order
        chosen = np.argpartition(rng.random((size, m)), n_in - 1, axis=1)[:, :n_in]
        rank_sums = ranks[chosen].sum(axis=1)
        values = (rank_sums - n_in * (n_in + 1) / 2) / (n_in * n_out)
        at_least += int((values >= observed - 1e-12).sum())
    return (1 + at_least) / (permutations + 1)


def _rule_name(rule: GuessRule) -> str:
    if not rule.negative:
        return f"the {rule.positive} highest scores guessed in"
    return f"the {rule.positive} highest in, the {rule.negative} lowest out"
