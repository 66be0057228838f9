"""`convex_head`: certified removal from an L2-regularised logistic-regression head on clipped
features (Guo, Goldstein, Hannun & van der Maaten 2020), certified by a measured residual.

One-vs-rest: class a's objective F_a(θ_a) = (1/n) Σ log(1 + exp(−t_ia θ_a·z_i)) + (λ/2)‖θ_a‖²,
z_i = (x_i, 1) clipped to ‖z_i‖ ≤ R, is λ-strongly convex, so for any w,
‖w − w*_r‖ ≤ ‖∇F_{D_r}(w)‖ / λ (the shift s, measured in float64 with its rounding bound).
σ = β · z(ε, δ) for a declared shift budget β: a release w⁻ + N(0, σ²I) with s ≤ β is
(ε, δ)-indistinguishable from w*_r + N(0, σ²I); s > β retrains exactly.
"""

from __future__ import annotations

import math

from pydantic import Field
from pydantic_core import PydanticCustomError

from app.core.jsontypes import JsonObject, JsonValue
from app.core.specs import ArchitectureSpec, LogRegSpec
from app.core.states import Guarantee
from app.privacy.gaussian import sigma_for
from app.privacy.lineage import gaussian_event
from app.privacy.plans import MIN_NOISE_MULTIPLIER, ReleasePlan, declared
from maths.blocks import CPU_BLOCK, ROWS_BYTES
from methods.spec import MemoryFacts, MethodOptions, MethodSpec, PreviewFacts, register


class ConvexHeadOptions(MethodOptions):
    """λ (applied by Lethe), the feature bound R on ‖(x, 1)‖, the shift budget β, and the
    solver: full-batch L-BFGS in float64 to `tolerance`, then Newton steps."""

    lam: float = Field(
        1e-3,
        ge=1e-10,  # below this s = ‖∇F‖/λ overflows and training fails (5e-324)
        le=1e3,
        description="L2 regularisation λ (strong convexity); it penalises the bias too, "
        "unlike scikit-learn's LogisticRegression",
    )
    R: float = Field(10.0, gt=1.0, le=1e6, description="bound on ‖(x, 1)‖: features are clipped")
    beta: float = Field(
        1e-3, gt=0.0, le=1e6, description="shift budget β: releases need measured s ≤ β"
    )
    tolerance: float = Field(
        1e-10, gt=0.0, le=1e-2, description="training stops at ‖∇F_D(w)‖ ≤ tolerance"
    )
    max_iterations: int = Field(500, ge=1, le=100_000, description="L-BFGS iterations")
    newton_steps: int = Field(
        6,
        ge=1,
        le=50,
        description="most Newton steps per removal (each with the resident anchored Hessian; "
        "stops once the bound on ‖∇F‖ is ≤ λβ)",
    )
    hessian_samples: int = Field(
        50_000,
        ge=100,
        le=10_000_000,
        description="unused (removals use the exact float64 Hessian over every "
        "retained row, kept resident); still accepted so that stored models load",
    )


def convex_head_plan(o: ConvexHeadOptions, epsilon: float, delta: float) -> ReleasePlan:
    """σ = β · z(ε, δ): data-free, known before any request (analytic Gaussian on Δ = β)."""
    sigma = sigma_for(o.beta, epsilon, delta)
    return ReleasePlan(
        "convex_head",
        "rigorous",
        sigma,
        o.beta,
        feasible=sigma / o.beta >= MIN_NOISE_MULTIPLIER,
        reason="released when the measured shift s ≤ β, else an exact retrain",
        constants={
            "lambda": declared(o.lam, "L2 regularisation, applied by Lethe"),
            "R": declared(o.R, "bound on ‖(x, 1)‖, enforced by clipping"),
            "beta": declared(o.beta, "shift budget: the Gaussian mechanism's sensitivity"),
        },
        event=gaussian_event(sigma, o.beta, epsilon, delta),
    )


def clipped_logreg(o: ConvexHeadOptions, architecture: ArchitectureSpec) -> ArchitectureSpec:
    """convex_head certifies a logistic head on inputs with ‖(x, 1)‖ ≤ R: the model's network
    clips them, in training and inference alike."""
    if not isinstance(architecture, LogRegSpec):
        raise PydanticCustomError(
            "convex_head_needs_logreg", "convex_head trains a logistic head: use logreg"
        )
    if architecture.feature_norm not in (None, o.R):
        raise PydanticCustomError(
            "feature_norm_mismatch",
            "architecture.feature_norm ({given}) must equal the method's R ({R})",
            {"given": architecture.feature_norm, "R": o.R},
        )
    return architecture.model_copy(update={"feature_norm": o.R})


def shift_view(o: ConvexHeadOptions, facts: PreviewFacts) -> JsonObject:
    """The preview's `shift`: the expected noise norm σ·√d and, for auditors and admins (each
    a function of the removed rows), the current noise-free ‖w‖ and the last requests' s/β."""
    d = facts.n_classes * (facts.n_features + 1)
    rows = [
        {
            "request_id": doc.get("request_id"),
            "n_removed": doc.get("n_removed"),
            "s": doc["constants"]["s"]["value"],
            "s_over_beta": doc["constants"]["s"]["value"] / doc["constants"]["beta"]["value"],
        }
        for doc in facts.recent
        if doc.get("constants", {}).get("s", {}).get("value") is not None
        and "beta" in doc.get("constants", {})
    ][-10:]
    recent: list[JsonValue] = list(rows)
    return {
        "shift": {
            "expected_noise_norm": facts.sigma * math.sqrt(d),
            # the noise-free ‖w‖ is a function of the removed rows: auditors only
            "weight_norm": facts.version_metrics.get("weight_norm") if facts.disclose else None,
            "parameters": d,
            "recent": recent if facts.disclose else None,
            "recent_disclosed_to": "auditors and admins",
        }
    }


def norm_bound(
    o: ConvexHeadOptions, _architecture: ArchitectureSpec, _features: int, n_classes: int
) -> float:
    """‖θ*‖ ≤ √k·R/λ: at each class's optimum λθ_a = −(1/n) Σ ℓ'·t_i·z_i with |ℓ'| ≤ 1 and
    ‖z_i‖ ≤ R (Guo et al. 2020, §3: the loss is 1-Lipschitz in the margin)."""
    return math.sqrt(n_classes) * o.R / o.lam


def _memory(o: ConvexHeadOptions, f: MemoryFacts) -> dict[str, int]:
    """A pass's float64 blocks (Z, its clipped copy, the margins: every pass streams the
    rows), the retained rows kept in float64 where they fit (removal.ROWS_BYTES), a
    block's copy of rows that are not consecutive, and the class Hessians with S."""
    d, k = f.n_features + 1, f.n_classes
    block = CPU_BLOCK
    return {
        "blocks": 3 * block * d * 8 + block * f.n_features * 4,
        "kept_rows": min(f.n_train * (d + k) * 8, ROWS_BYTES),
        "hessians": 2 * (k + 1) * d * d * 8,
    }


SPEC = register(
    MethodSpec(
        name="convex_head",
        guarantee=Guarantee.rigorous,
        options=ConvexHeadOptions,
        summary="Newton removal on a strongly convex logistic head; noise on a measured shift",
        examples={
            "model": {
                "summary": "a certified logistic head on embeddings",
                "value": {
                    "name": "head",
                    "dataset_id": 1,
                    "architecture": {"type": "logreg"},
                    "method": {"name": "convex_head", "lam": 0.001, "R": 20, "beta": 0.001},
                    "privacy": {"epsilon": 1.0, "delta": 1e-5},
                },
            }
        },
        planner=convex_head_plan,
        fit_architecture=clipped_logreg,
        preview_extras=shift_view,
        memory_terms=_memory,
        norm_bound=norm_bound,
    )
)
