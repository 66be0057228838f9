"""`anchor_topics`: seed 000's unlearning of an anchor-word topic model (Algorithm 1, 𝒰_base).

Training: the anchor-word algorithm on the corpus's co-occurrences; the stored statistic is
the un-normalised Σ G_d with the document count. A removal subtracts the removed documents'
G_d exactly, keeps the anchors, recomputes C (closed-form least squares and a simplex
projection), A and R, and releases A + ν_A (columns projected onto the simplex) and R + ν_R
(projected onto the PSD cone). σ comes from the unsimplified bound of note A.5.3,

    Δ_A = c·√(nr)·(ar)·(4/(γp))·(√(4ar/(mε₀)) + 4ar·m_U/(mε₀)),

with m_U the cumulative removed documents, through the analytic Gaussian on Δ = √2·Δ_A (A and
R released together, R's Δ taken equal to A's: the paper gives none). The constants c, a, γ,
p, ε₀ are declared; a, p, γ are also estimated from the learned model and recorded as
measured. Past the deletion capacity (Theorem 5) or the anchor-stability bound
m_U ≤ 0.001·m·ε₀(γp)³/(a²r²), Lethe retrains exactly (and m_U restarts at 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.errors import unprocessable
from app.core.jsontypes import JsonMap
from app.core.specs import ArchitectureSpec, TopicModelSpec
from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from app.privacy.plans import ReleasePlan
from methods.spec import MethodOptions, MethodSpec, register


class AnchorTopicsOptions(MethodOptions):
    """The paper's problem constants, declared (seed 000 never quantifies them)."""

    c: float = Field(1.0, gt=0.0, le=1e9, description="the bound's unspecified constant c")
    a: float = Field(2.0, ge=1.0, le=1e6, description="topic imbalance a (declared)")
    gamma: float = Field(0.5, gt=0.0, le=1e6, description="γ: the anchor simplex is γp-robust")
    p: float = Field(0.05, gt=0.0, le=1.0, description="p-separability of the anchor words")
    eps0: float = Field(0.05, gt=0.0, le=1.0, description="ε₀: the learning tolerance")
    calibrate_with: Literal["declared", "estimated"] = Field(
        "declared",
        description="calibrate σ and the capacity with the declared a, γ, p, or with those "
        "estimated from the learned model (both are recorded in every certificate)",
    )


def sensitivity(
    c: float, a: float, gamma: float, p: float, eps0: float, n: int, r: int, m: int, m_u: int
) -> float:
    """Δ_A of note A.5.3, unsimplified (the δ₂ term the main text drops is kept)."""
    statistical = math.sqrt(4 * a * r / (m * eps0))
    deletion = 4 * a * r * m_u / (m * eps0)
    return c * math.sqrt(n * r) * (a * r) * (4 / (gamma * p)) * (statistical + deletion)


def capacity(
    c: float,
    a: float,
    gamma: float,
    p: float,
    eps0: float,
    n: int,
    r: int,
    m: int,
    epsilon: float,
    delta: float,
) -> dict[str, float]:
    """Theorem 5's deletion capacity (its two terms) and the anchor-stability bound."""
    noise = c * m * epsilon / (r**2 * math.sqrt(r * n * math.log(1 / delta)))
    return with_stability_bounds(noise, c, a, gamma, p, eps0, r, m)


def with_stability_bounds(
    noise: float, c: float, a: float, gamma: float, p: float, eps0: float, r: int, m: int
) -> dict[str, float]:
    """A capacity's noise term beside the two bounds Theorems 5 and 7 share: the bias term
    c·0.001·m/r² and the anchor stability 0.001·m·ε₀(γp)³/(a²r²); the capacity is the least."""
    bias = c * 0.001 * m / r**2
    anchors = 0.001 * m * eps0 * (gamma * p) ** 3 / (a**2 * r**2)
    return {
        "noise_term": noise,
        "bias_term": bias,
        "anchor_stability": anchors,
        "documents": min(noise, bias, anchors),
    }


class PlanInputs(BaseModel):
    """What a topic model's version records for the preview to plan the next release as the
    update will (`plan_inputs` in its metrics): the constants and the corpus's shape."""

    model_config = ConfigDict(frozen=True)  # other recorded keys are ignored

    c: float
    a: float
    gamma: float
    p: float
    eps0: float
    n: int  # vocabulary
    r: int  # topics
    m: int  # documents at training
    m_u: int  # documents removed since


def next_release(
    o: AnchorTopicsOptions, recorded: JsonMap, epsilon: float, delta: float
) -> ReleasePlan:
    """The next request's release, for one removed document, from the current version's
    `plan_inputs`: the capacity at (ε, δ) and, within it, σ on Δ = √2·Δ_A at m_U + 1; past it,
    the request retrains exactly (`unlearn` raises TargetInfeasible the same way)."""
    k = PlanInputs.model_validate(recorded)
    limit = capacity(k.c, k.a, k.gamma, k.p, k.eps0, k.n, k.r, k.m, epsilon, delta)

    def joint(m_u: int) -> float:
        return math.sqrt(2) * sensitivity(k.c, k.a, k.gamma, k.p, k.eps0, k.n, k.r, k.m, m_u)

    return plan_within_capacity(
        "anchor_topics",
        "deletion capacity",
        limit,
        k.m_u,
        joint,
        o.calibrate_with,
        epsilon,
        delta,
    )


def plan_within_capacity(
    method: str,
    what: str,
    limit: dict[str, float],
    m_u: int,
    sensitivity_at: Callable[[int], float],
    calibrate_with: str,
    epsilon: float,
    delta: float,
) -> ReleasePlan:
    """A topic model's next release for one more removed document (shared by anchor_topics
    and topic_head): infeasible past the capacity `limit`, else the analytic Gaussian on the
    sensitivity at m_U + 1."""
    used = {**limit, "removed_since_training": float(m_u)}
    if m_u + 1 > limit["documents"]:
        reason = (
            f"the {what} at (ε={epsilon:g}, δ={delta:g}) is {limit['documents']:.4g} documents "
            f"and {m_u} were removed since training: the next request retrains exactly"
        )
        return ReleasePlan(method, "conditional", 0.0, 0.0, False, reason, capacity=used)
    sens = sensitivity_at(m_u + 1)
    sigma = sigma_for(sens, epsilon, delta)
    reason = f"for a request of one document (m_U = {m_u + 1}); " + (
        "the declared constants make this exact"
        if calibrate_with == "declared"
        else "the constants are re-estimated from the updated model, so σ may differ slightly"
    )
    return ReleasePlan(
        method,
        "conditional",
        sigma,
        sens,
        True,
        reason,
        event=gaussian_event(sigma, sens, epsilon_for(sens, sigma, delta), delta),
        capacity=used,
    )


def check_model(
    o: AnchorTopicsOptions, architecture: ArchitectureSpec, n_train: int, n_features: int
) -> None:
    if not isinstance(architecture, TopicModelSpec):
        raise unprocessable(
            "anchor_topics_needs_topic_model",
            "anchor_topics unlearns a topic model: use the `topic_model` architecture",
        )
    if architecture.topics >= n_features:
        raise unprocessable(
            "vocabulary_too_small",
            f"{architecture.topics} topics need a vocabulary of more than "
            f"{architecture.topics} words (one anchor word each); it has {n_features}",
            {"topics": architecture.topics, "vocabulary": n_features},
        )
    if n_train < architecture.topics:
        raise unprocessable(
            "corpus_too_small", f"{n_train} training documents for {architecture.topics} topics"
        )


SPEC = register(
    MethodSpec(
        name="anchor_topics",
        guarantee=Guarantee.conditional,
        options=AnchorTopicsOptions,
        summary="seed 000: anchor-word topic model, subtract and re-solve, Gaussian release",
        records_training=True,
        check_model=check_model,
        next_release=next_release,
        exclusive_to=(
            TopicModelSpec,
            "topic_model_needs_anchor_topics",
            "a topic_model is learned by the anchor-word algorithm: use the anchor_topics "
            "method (a request may still ask for an exact retrain)",
        ),
    )
)
