"""`topic_head`: seed 000's unlearning of a classifier head on a topic model (Algorithm 2,
𝒰_head, realistic setting: only B = A_S w is released).

A removal recomputes Ā from the stored co-occurrence sum without the removed documents
(anchors kept), takes one Newton step on the head from w_S with topic features x̄ᵀĀ, maps it
into the old base, v̄ = A_S†Āw̄, and releases ṽ = v̄ + N(0, σ_v²I); the served model is
B̃ = A_S ṽ. σ_v comes from Lemma 29 (general task rarity q) through the analytic Gaussian:

    E = (ar)²·m_U/(mε₀γp),
    Δ_v = (c/p)·(√r·E + B·√(nr)·(1/q)·ar·m_U/(mε₀γp) + E²·√(nr)).

Only the head's output is covered: A_S itself was learned with the removed documents and is
not unlearned (note A.9 item 9). Past Theorem 7's capacity or the anchor-stability bound,
Lethe retrains exactly.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from app.core.errors import unprocessable
from app.core.jsontypes import JsonMap
from app.core.specs import ArchitectureSpec, TopicHeadSpec
from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan
from methods.anchor_topics.spec import PlanInputs, plan_within_capacity, with_stability_bounds
from methods.spec import MethodOptions, MethodSpec, register


class TopicHeadOptions(MethodOptions):
    """The head's regularisation and solver, and the paper's constants (declared)."""

    lam: float = Field(1e-2, ge=1e-10, le=1e3, description="L2 regularisation λ of the head")
    tolerance: float = Field(1e-8, gt=0.0, le=1e-2, description="training stops at ‖∇ℓ‖ ≤ it")
    max_iterations: int = Field(500, ge=1, le=100_000, description="L-BFGS iterations")
    c: float = Field(1.0, gt=0.0, le=1e9, description="the bound's unspecified constant c'")
    a: float = Field(2.0, ge=1.0, le=1e6, description="topic imbalance a")
    gamma: float = Field(0.5, gt=0.0, le=1e6, description="γ: anchor simplex robustness / p")
    p: float = Field(0.05, gt=0.0, le=1.0, description="p-separability of the anchor words")
    eps0: float = Field(0.05, gt=0.0, le=1.0, description="ε₀: the learning tolerance")
    B: float = Field(10.0, gt=0.0, le=1e6, description="bound on ‖w‖ (Assumption 5)")
    q: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="task rarity min_k Pr[z = k] over the task's topics (default: the worst "
        "case 1/(a·r))",
    )
    calibrate_with: Literal["declared", "estimated"] = "declared"


def head_sensitivity(
    c: float,
    a: float,
    gamma: float,
    p: float,
    eps0: float,
    B: float,
    q: float,
    n: int,
    r: int,
    m: int,
    m_u: int,
) -> float:
    """Δ_v of Lemma 29 (general q), the analytic Gaussian's sensitivity."""
    E = (a * r) ** 2 * m_u / (m * eps0 * gamma * p)
    shift = a * r * m_u / (m * eps0 * gamma * p)
    return (c / p) * (math.sqrt(r) * E + B * math.sqrt(n * r) * shift / q + E**2 * math.sqrt(n * r))


def head_capacity(
    c: float,
    a: float,
    gamma: float,
    p: float,
    eps0: float,
    q: float,
    n: int,
    r: int,
    m: int,
    epsilon: float,
    delta: float,
) -> dict[str, float]:
    """Theorem 7's capacity (its two terms) and the anchor-stability bound."""
    noise = c * m * q * epsilon / (r * math.sqrt(n * r * math.log(1 / delta)))
    return with_stability_bounds(noise, c, a, gamma, p, eps0, r, m)


class HeadPlanInputs(PlanInputs):
    """A topic head's `plan_inputs`: the base's, with the head's q and B."""

    q: float
    B: float


def next_release(
    o: TopicHeadOptions, recorded: JsonMap, epsilon: float, delta: float
) -> ReleasePlan:
    """The next request's release, for one removed document, from the current version's
    `plan_inputs`: Theorem 7's capacity at (ε, δ) and, within it, σ_v on Δ_v at m_U + 1."""
    k = HeadPlanInputs.model_validate(recorded)
    limit = head_capacity(k.c, k.a, k.gamma, k.p, k.eps0, k.q, k.n, k.r, k.m, epsilon, delta)

    def delta_v(m_u: int) -> float:
        return head_sensitivity(k.c, k.a, k.gamma, k.p, k.eps0, k.B, k.q, k.n, k.r, k.m, m_u)

    return plan_within_capacity(
        "topic_head",
        "head's deletion capacity",
        limit,
        k.m_u,
        delta_v,
        o.calibrate_with,
        epsilon,
        delta,
    )


def check_model(
    _: TopicHeadOptions, architecture: ArchitectureSpec, n_train: int, n_features: int
) -> None:
    if not isinstance(architecture, TopicHeadSpec):
        raise unprocessable(
            "topic_head_needs_topic_head",
            "topic_head trains a head on a topic model: use the `topic_head` architecture "
            "with a `base_model`",
        )


SPEC = register(
    MethodSpec(
        name="topic_head",
        guarantee=Guarantee.conditional,
        options=TopicHeadOptions,
        summary="seed 000 Algorithm 2: Newton step on a topic-model head, noise in the old base",
        records_training=True,
        check_model=check_model,
        next_release=next_release,
        exclusive_to=(
            TopicHeadSpec,
            "topic_head_needs_topic_head_method",
            "a topic_head is trained and unlearned by the topic_head method",
        ),
    )
)
