"""topic_head: seed 000, Algorithm 6 (training) and Algorithm 2 (𝒰_head). See
spec.py beside this file for the bound.

Training learns A_S as the base topic model does (same anchors algorithm, projection and
seed, on the same corpus), then the strongly convex one-vs-rest logistic head w_S on the
topic features x̄ᵀA_S (maths/convex.py, float64). Served: B = A_S w (vocabulary × classes)
and the bias. The noise-free state keeps Σ G_d, the anchors, A_S and w_S: each removal starts
from them with the cumulative removed documents (note A.9 item 5).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from app.core.jsontypes import JsonObject, JsonValue, json_object
from app.core.specs import TopicHeadSpec
from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from maths import convex
from maths import topics as tp
from maths.training import ProgressFn
from methods.compute import (
    CertificateFields,
    Constant,
    ModelState,
    PrivacyTarget,
    PublicInfeasible,
    Release,
    RetainedData,
    TargetInfeasible,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    register,
)
from methods.noise import draw_gaussian, secure_generator
from methods.topic_head.spec import SPEC, TopicHeadOptions, head_capacity, head_sensitivity

STATISTIC = "head.cooccurrence_sum"
DOCUMENTS = "head.documents"
ORIGINAL = "head.original_documents"
# a, p, γ, q estimated on the base as trained, published with it: what `estimated` calibration
# uses ever after, so σ and the capacity are no function of the rows later removed
TRAINED_ESTIMATES = "head.trained_estimates"
REMOVED = "head.removed_documents"
ANCHORS = "head.anchors"
BASE = "head.A_S"  # the base topic model the head is served in (never released alone)
HEAD = "head.w_S"  # the trained head, classes × (topics + 1)
# Topic features n·x̄ᵀA: x̄ the word frequencies, scaled by the vocabulary size n so that an
# average word weighs about one (A's entries are of order 1/n); never clipped in practice.
FEATURE_BOUND = 1e6
NOISE = True  # tests switch the Gaussian mechanism off


def frequencies(X: torch.Tensor) -> torch.Tensor:
    """n·x̄: word frequencies times the vocabulary size."""
    counts = X.reshape(len(X), -1).double()
    return counts.shape[1] * counts / counts.sum(1, keepdim=True).clamp(min=1.0)


@register
class TopicHead(UnlearningMethod):
    spec = SPEC

    @property
    def options(self) -> TopicHeadOptions:
        return self.model.method.options

    @property
    def architecture(self) -> TopicHeadSpec:
        arch = self.model.architecture
        assert isinstance(arch, TopicHeadSpec)
        return arch

    def _problem(self, X: torch.Tensor, y: torch.Tensor, A: torch.Tensor) -> convex.Problem:
        features = frequencies(X) @ A
        return convex.Problem.of(features, y, self.model.n_classes, FEATURE_BOUND, self.options.lam)

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """Algorithm 6: 𝒜_base(S), then argmin_w ℓ_T(w; A_S)."""
        start = time.perf_counter()
        arch, o = self.architecture, self.options
        S, m, anchors, base = tp.learn(data.X, arch.topics, arch.projection_dim, arch.seed)
        solution = convex.solve(
            self._problem(data.X, data.y, base.A), o.tolerance, o.max_iterations
        )
        if progress is not None:
            progress(1, 1, solution.gradient_norm)
        w = solution.theta
        weights = _served(base.A, w[:, :-1].T, w[:, -1])
        extra = {
            STATISTIC: S,
            DOCUMENTS: torch.tensor(m),
            ORIGINAL: torch.tensor(m),
            REMOVED: torch.tensor(0),
            ANCHORS: torch.tensor(anchors),
            BASE: base.A,
            HEAD: w,
            TRAINED_ESTIMATES: tp.estimates_tensor(tp.estimates(base)),
        }
        metrics: JsonObject = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data.X),
            "gradient_norm": solution.gradient_norm,
            "head_norm": float(torch.linalg.norm(w)),
            "anchors": list[JsonValue](anchors),
            "plan_inputs": self._plan_inputs(self._constants(base, extra), base.A.shape, m, 0),
        }
        return Trained(weights, None, {}, metrics, extra_state=extra)

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        o, state, target = self.options, inputs.state, inputs.target
        S, m = tp.without(state[STATISTIC], int(state[DOCUMENTS]), inputs.removed.X)
        m_original, m_u = int(state[ORIGINAL]), int(state[REMOVED]) + len(inputs.removed.y)
        anchors = [int(a) for a in state[ANCHORS].tolist()]
        A_S, w_S = state[BASE].double(), state[HEAD].double()
        updated = tp.recover_topics(S, m, anchors)  # Ā, not released
        constants = self._constants(updated, state)
        n, r = A_S.shape
        c = constants
        limit = head_capacity(
            o.c, c["a"], c["gamma"], c["p"], o.eps0, c["q"], n, r, m_original, *_target_of(target)
        )
        self._check_capacity(state, limit, m_u)
        v_bar, bias = self._head_step(inputs.retained, updated, A_S, w_S)
        delta_v = head_sensitivity(
            o.c, c["a"], c["gamma"], c["p"], o.eps0, o.B, c["q"], n, r, m_original, m_u
        )
        sigma = sigma_for(delta_v, target.epsilon, target.delta)
        weights = _served(A_S, *_noised(sigma, v_bar, bias))
        epsilon = epsilon_for(delta_v, sigma, target.delta) if delta_v > 0 else 0.0
        w_norm = float(torch.linalg.norm(w_S))
        cert = self._certificate(
            constants, limit, m_original, m_u, sigma, delta_v, epsilon, target.delta, w_norm
        )
        counts = {DOCUMENTS: m, ORIGINAL: m_original, REMOVED: m_u}
        return Release(
            next_state=_next_state(state, weights, S, counts, A_S, w_S),
            weights=weights,
            certificate=cert,
            event=gaussian_event(sigma, delta_v, epsilon, target.delta) if sigma > 0 else None,
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "sigma": sigma,
                "sensitivity_v": delta_v,
                "noise": NOISE,
                "removed_documents_cumulative": m_u,
                "deletion_capacity": json_object(limit),
                "estimates": json_object(tp.estimates(updated)),
                "plan_inputs": self._plan_inputs(constants, A_S.shape, m_original, m_u),
            },
        )

    def _check_capacity(self, state: ModelState, limit: dict[str, float], m_u: int) -> None:
        """Past the head's deletion capacity (Theorem 7) the exact retrain is released: with
        declared constants the capacity is a function of counts and options, so the retrain
        it leads to is public; estimated constants are the data's."""
        if m_u > limit["documents"]:
            raise self._infeasible(state)(
                f"the cumulative {m_u} removed documents exceed the head's deletion capacity "
                f"{limit['documents']:.4g} (Theorem 7: noise term {limit['noise_term']:.4g}, "
                f"bias term {limit['bias_term']:.4g}; anchor stability "
                f"{limit['anchor_stability']:.4g})"
            )

    def _head_step(
        self, retained: RetainedData, updated: tp.Topics, A_S: torch.Tensor, w_S: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One Newton step from w_S on the updated topics Ā, mapped back to the old base:
        the head (r × classes) and its bias, before noise."""
        problem = self._problem(retained.X, retained.y, updated.A)
        H = convex.hessians(problem, w_S)
        w_bar, _ = convex.newton_steps(problem, w_S, H, 1)
        v_bar = torch.linalg.pinv(A_S) @ updated.A @ w_bar[:, :-1].T
        return v_bar, w_bar[:, -1]

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The head retrained from scratch on the retained documents (Algorithm 6)."""
        return self.train(inputs.retained).state

    def _plan_inputs(
        self, constants: dict[str, float], shape: tuple[int, ...], m: int, m_u: int
    ) -> JsonObject:
        """What the preview needs to plan the next release as `unlearn` will
        (spec.py: next_release)."""
        o = self.options
        n, r = shape
        return {"c": o.c, **constants, "eps0": o.eps0, "B": o.B, "n": n, "r": r, "m": m, "m_u": m_u}

    def _constants(self, topics: tp.Topics, state: ModelState) -> dict[str, float]:
        """a, γ, p, q as calibration uses them: declared, or estimated on the base as trained
        (a model trained before those were kept: on the updated topics, which is private)."""
        o = self.options
        if o.calibrate_with == "estimated":
            if TRAINED_ESTIMATES in state:
                return tp.estimates_of(state[TRAINED_ESTIMATES])
            return tp.estimates(topics)
        r = topics.A.shape[1]
        return {"a": o.a, "gamma": o.gamma, "p": o.p, "q": o.q or 1 / (o.a * r)}

    def _infeasible(self, state: ModelState) -> type[TargetInfeasible]:
        """Over capacity: public when the constants are (declared, or estimated at training)."""
        public = self.options.calibrate_with == "declared" or TRAINED_ESTIMATES in state
        return PublicInfeasible if public else TargetInfeasible

    def _certificate(
        self,
        constants: dict[str, float],
        limit: dict[str, float],
        m: int,
        m_u: int,
        sigma: float,
        delta_v: float,
        epsilon: float,
        delta: float,
        head_norm: float,
    ) -> CertificateFields:
        o = self.options
        sentence = (
            f"Covers only the head's output: the released B̃ = A_S ṽ is conditionally "
            f"(ε={epsilon:.4g}, δ={delta:.3g})-indistinguishable in ṽ from the head retrained "
            f"on the topic model without the {m_u} removed documents, expressed in the same "
            f"base A_S (seed 000, Theorem 7). A_S itself was learned with the removed documents "
            f"and is NOT unlearned (note A.9 item 9). It holds with probability 0.9 over the "
            f"corpus, if the constants c'={o.c:g}, a={constants['a']:.3g}, "
            f"γ={constants['gamma']:.3g}, p={constants['p']:.3g}, ε₀={o.eps0:g}, "
            f"B={o.B:g} and q={constants['q']:.3g} ({o.calibrate_with}) hold; σ_v = "
            f"{sigma:.4g} (Lemma 29, analytic Gaussian), capacity {limit['documents']:.4g} "
            f"documents of m = {m}."
        )
        return CertificateFields(
            guarantee=Guarantee.conditional,
            epsilon=epsilon,
            delta=delta,
            sigma=sigma,
            sensitivity=delta_v,
            accountant="analytic Gaussian mechanism (Balle & Wang 2018) via dp-accounting",
            sentence=sentence,
            constants={
                "c": Constant(o.c, "declared", "the bound's unspecified constant c'"),
                "a": Constant(constants["a"], _source(o), "topic imbalance"),
                "gamma": Constant(constants["gamma"], _source(o), "anchor robustness / p"),
                "p": Constant(constants["p"], _source(o), "anchor-word separability"),
                "q": Constant(constants["q"], _source(o), "task rarity"),
                "eps0": Constant(o.eps0, "declared", "learning tolerance ε₀"),
                "B": Constant(o.B, "declared", "bound on ‖w‖ (Assumption 5)"),
                "head_norm": Constant(head_norm, "measured", "‖w_S‖ (B must bound it)"),
                "m": Constant(float(m), "measured", "training documents"),
                "m_U": Constant(float(m_u), "measured", "documents removed since training"),
            },
            compares="ṽ vs. (A_S)† A^F w^F, the retrained head in the old base, through the "
            "same Gaussian mechanism (seed 000, Algorithm 2); A_S is not covered",
        )


def _served(A_S: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> ModelState:
    """B = n·A_S v (vocabulary × classes; the feature scale folded in) and the bias: the
    logits of a document are x̄ᵀB + bias."""
    return {"B": (A_S.shape[0] * A_S @ v).contiguous(), "bias": bias.contiguous().clone()}


def _source(o: TopicHeadOptions) -> Any:
    return "declared" if o.calibrate_with == "declared" else "measured"


def _target_of(target: PrivacyTarget) -> tuple[float, float]:
    return target.epsilon, target.delta


def _noised(
    sigma: float, v_bar: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The head and its bias with Gaussian noise of `sigma` (none where NOISE is off)."""
    if not NOISE:
        return v_bar, bias
    gen = secure_generator()
    v_bar = v_bar + sigma * draw_gaussian(v_bar.shape, gen, v_bar.dtype, v_bar.device)
    return v_bar, bias + sigma * draw_gaussian(bias.shape, gen, bias.dtype, bias.device)


def _next_state(
    state: ModelState,
    weights: ModelState,
    S: torch.Tensor,
    counts: dict[str, int],
    A_S: torch.Tensor,
    w_S: torch.Tensor,
) -> ModelState:
    """What the next update starts from: the served weights, the updated statistic and
    counts, and the trained base and head (the certified shift is measured from them)."""
    kept = {k: state[k] for k in (ANCHORS, TRAINED_ESTIMATES) if k in state}
    counted = {k: torch.tensor(v) for k, v in counts.items()}
    return {**weights, STATISTIC: S, **counted, BASE: A_S, HEAD: w_S, **kept}
