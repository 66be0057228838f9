"""anchor_topics: seed 000, Algorithm 1 (𝒰_base), on the statistic Σ G_d kept in the noise-free
state (never downloadable, purged with its version). See spec.py beside this file for the
bound and the capacity; maths/topics.py for the algorithm.

Every release is noised, the first one after training included (note A.9 item 6: the
comparator is the retrained model passed through the same mechanism), with σ calibrated to the
cumulative number of removed documents and computed from the current statistic, which equals
the original minus every removed document (note A.9 item 5).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch

from app.core.jsontypes import JsonObject
from app.core.specs import TopicModelSpec
from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from maths import topics as tp
from maths.training import ProgressFn
from methods.anchor_topics.spec import SPEC, AnchorTopicsOptions, capacity, sensitivity
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

STATISTIC = "topics.cooccurrence_sum"  # Σ G_d over the documents still held (n × n)
DOCUMENTS = "topics.documents"  # how many of them have two words or more
ORIGINAL = "topics.original_documents"  # m at training: the bound's m
REMOVED = "topics.removed_documents"  # m_U: removed since training
ANCHORS = "topics.anchors"
# a, p, γ, q estimated on the model as trained, published with it: what `estimated` calibration
# uses ever after, so σ and the capacity are no function of the rows later removed
TRAINED_ESTIMATES = "topics.trained_estimates"
NOISE = True  # tests switch the Gaussian mechanism off to compare with the noise-free solve


@register
class AnchorTopics(UnlearningMethod):
    spec = SPEC

    @property
    def options(self) -> AnchorTopicsOptions:
        return self.model.method.options

    @property
    def architecture(self) -> TopicModelSpec:
        arch = self.model.architecture
        assert isinstance(arch, TopicModelSpec)
        return arch

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """Co-occurrences, anchors (Algorithm 4), topics (Algorithm 5), a noised release."""
        start = time.perf_counter()
        arch = self.architecture
        S, m, anchors, topics = tp.learn(data.X, arch.topics, arch.projection_dim, arch.seed)
        if progress is not None:
            progress(1, 1, 0.0)
        extra = {
            STATISTIC: S,
            DOCUMENTS: torch.tensor(m),
            ORIGINAL: torch.tensor(m),
            REMOVED: torch.tensor(0),
            ANCHORS: torch.tensor(anchors),
            TRAINED_ESTIMATES: tp.estimates_tensor(tp.estimates(topics)),
        }
        # No request exists yet: the training release is calibrated for the policy's target,
        # the same one every later release (and the preview) uses by default.
        weights, calibration = self._release(topics, extra, m, 0, self.model.target)
        metrics = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data.X),
            "documents_counted": m,
            "anchors": anchors,
            "plan_inputs": self._plan_inputs(topics, extra, m, 0),
            **calibration,
        }
        return Trained(
            state=weights, statistics=None, record={}, metrics=metrics, extra_state=extra
        )

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        state, target = inputs.state, inputs.target
        S, m = tp.without(state[STATISTIC], int(state[DOCUMENTS]), inputs.removed.X)
        m_original = int(state[ORIGINAL])
        m_u = int(state[REMOVED]) + len(inputs.removed.sample_ids)
        anchors = [int(a) for a in state[ANCHORS].tolist()]
        topics = tp.recover_topics(S, m, anchors)
        limit = self._capacity(topics, state, m_original, target)
        if m_u > limit["documents"]:
            # with declared constants the capacity is a function of counts and options, so
            # the retrain it leads to is public; estimated constants are the data's
            raise self._infeasible(state)(
                f"the cumulative {m_u} removed documents exceed the deletion capacity "
                f"{limit['documents']:.4g} (Theorem 5: noise term {limit['noise_term']:.4g}, "
                f"bias term {limit['bias_term']:.4g}; anchor stability "
                f"{limit['anchor_stability']:.4g})"
            )
        weights, calibration = self._release(topics, state, m_original, m_u, target)
        extra = {
            STATISTIC: S,
            DOCUMENTS: torch.tensor(m),
            ORIGINAL: torch.tensor(m_original),
            REMOVED: torch.tensor(m_u),
            ANCHORS: state[ANCHORS],
            **({TRAINED_ESTIMATES: state[TRAINED_ESTIMATES]} if TRAINED_ESTIMATES in state else {}),
        }
        cert = self._certificate(calibration, topics, m_original, m_u, target, limit)
        return Release(
            next_state={**weights, **extra},
            weights=weights,
            certificate=cert,
            event=gaussian_event(
                calibration["sigma"],
                calibration["joint_sensitivity"],
                cert.epsilon or 0.0,
                target.delta,
            ),
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "removed_documents_cumulative": m_u,
                "documents_counted": m,
                "plan_inputs": self._plan_inputs(topics, state, m_original, m_u),
                **calibration,
            },
        )

    def _words(self, ids: list[list[int]]) -> list[list[str]] | list[list[int]]:
        words = self.model.vocabulary
        return ids if words is None else [[words[i] for i in topic] for topic in ids]

    def _constants(self, topics: tp.Topics, state: ModelState) -> dict[str, float]:
        """a, γ, p as calibration uses them: declared, or estimated on the model as trained
        (a model trained before those were kept: on the updated one, which is private)."""
        o = self.options
        if o.calibrate_with == "declared":
            return {"a": o.a, "gamma": o.gamma, "p": o.p}
        if TRAINED_ESTIMATES in state:
            return tp.estimates_of(state[TRAINED_ESTIMATES])
        return tp.estimates(topics)

    def _infeasible(self, state: ModelState) -> type[TargetInfeasible]:
        """Over capacity: public when the constants are (declared, or estimated at training)."""
        public = self.options.calibrate_with == "declared" or TRAINED_ESTIMATES in state
        return PublicInfeasible if public else TargetInfeasible

    def _plan_inputs(self, topics: tp.Topics, state: ModelState, m: int, m_u: int) -> JsonObject:
        """What the preview needs to plan the next release exactly as `unlearn` will
        (spec.py: next_release)."""
        o, k = self.options, self._constants(topics, state)
        n, r = topics.A.shape
        return {"c": o.c, **k, "eps0": o.eps0, "n": n, "r": r, "m": m, "m_u": m_u}

    def _capacity(
        self, topics: tp.Topics, state: ModelState, m: int, target: PrivacyTarget
    ) -> dict[str, float]:
        o, k = self.options, self._constants(topics, state)
        n, r = topics.A.shape
        return capacity(
            o.c, k["a"], k["gamma"], k["p"], o.eps0, n, r, m, target.epsilon, target.delta
        )

    def _release(
        self, topics: tp.Topics, state: ModelState, m: int, m_u: int, target: PrivacyTarget
    ) -> tuple[ModelState, dict[str, Any]]:
        """Ã = columns of A + ν_A on the simplex, R̃ = R + ν_R on the PSD cone."""
        o, k = self.options, self._constants(topics, state)
        n, r = topics.A.shape
        delta_a = sensitivity(o.c, k["a"], k["gamma"], k["p"], o.eps0, n, r, m, m_u)
        joint = delta_a * 2**0.5
        sigma = sigma_for(joint, target.epsilon, target.delta)
        A, R = topics.A, topics.R
        if NOISE:
            gen = secure_generator()
            A = A + sigma * draw_gaussian(A.shape, gen, A.dtype, A.device)
            R = R + sigma * draw_gaussian(R.shape, gen, R.dtype, R.device)
        released = {
            "A": tp.project_simplex(A.T).T.contiguous(),
            "R": tp.project_psd(R).contiguous(),
        }
        calibration = {
            "sigma": sigma,
            "sensitivity_A": delta_a,
            "joint_sensitivity": joint,
            "noise": NOISE,
            "calibrated_with": o.calibrate_with,
            "estimates": tp.estimates(topics),
            "calibration_constants": k,
            "deletion_capacity": self._capacity(topics, state, m, target),
            "top_words": self._words(tp.top_words(released["A"])),  # of the noised release
        }
        return released, calibration

    def _certificate(
        self,
        calibration: dict[str, Any],
        topics: tp.Topics,
        m: int,
        m_u: int,
        target: PrivacyTarget,
        limit: dict[str, float],
    ) -> CertificateFields:
        o, est, k = self.options, calibration["estimates"], calibration["calibration_constants"]
        n, r = topics.A.shape
        sigma, joint = calibration["sigma"], calibration["joint_sensitivity"]
        epsilon = epsilon_for(joint, sigma, target.delta)
        sentence = (
            f"Conditionally (ε={epsilon:.4g}, δ={target.delta:.3g})-indistinguishable from "
            f"retraining the topic model on the documents left (seed 000, Theorem 5), anchors "
            f"kept, released through the same Gaussian mechanism, with probability 0.9 over "
            f"the corpus: it holds only if the declared constants c={o.c:g}, a={o.a:g}, "
            f"γ={o.gamma:g}, p={o.p:g} and ε₀={o.eps0:g} hold for the corpus's distribution "
            f"(σ used the {o.calibrate_with} ones: a={k['a']:.3g}, γ={k['gamma']:.3g}, "
            f"p={k['p']:.3g}; the estimates on the updated model go to auditors). "
            f"σ = {sigma:.4g} covers "
            f"the {m_u} documents removed since training out of m = {m} (capacity "
            f"{limit['documents']:.4g}); R's sensitivity is taken equal to A's, which the "
            "paper does not bound."
        )
        constants = {
            "c": Constant(o.c, "declared", "the bound's unspecified constant"),
            "a": Constant(o.a, "declared", "topic imbalance"),
            "gamma": Constant(o.gamma, "declared", "anchor simplex robustness / p"),
            "p": Constant(o.p, "declared", "anchor-word separability"),
            "eps0": Constant(o.eps0, "declared", "learning tolerance ε₀"),
            **{
                f"{name}_used": Constant(
                    k[name], _source(o), f"{name} as σ used it ({o.calibrate_with})"
                )
                for name in ("a", "gamma", "p")
            },
            "a_estimated": updated(est["a"], "max/min topic mass of diag(p)C"),
            "gamma_estimated": updated(
                est["gamma"], "anchor rows' distance to the others' span / p"
            ),
            "p_estimated": updated(est["p"], "min_k A[anchor_k, k]"),
            "m": Constant(float(m), "measured", "training documents"),
            "m_U": Constant(float(m_u), "measured", "documents removed since training"),
            "capacity": Constant(limit["documents"], "measured", "Theorem 5 / anchor bound"),
        }
        return CertificateFields(
            guarantee=Guarantee.conditional,
            epsilon=epsilon,
            delta=target.delta,
            sigma=sigma,
            sensitivity=joint,
            accountant="analytic Gaussian mechanism (Balle & Wang 2018) via dp-accounting",
            sentence=sentence,
            constants=constants,
            compares="release vs. the topic model retrained on the retained documents with the "
            "same anchors, through the same Gaussian mechanism (seed 000, Def. 4)",
        )


def _source(o: AnchorTopicsOptions) -> Literal["declared", "measured"]:
    return "declared" if o.calibrate_with == "declared" else "measured"


def updated(value: float, meaning: str) -> Constant:
    """An estimate on the updated topics: a function of the rows left, for auditors only."""
    return Constant(
        value, "measured", f"{meaning}, on the updated model", "auditors", "shown to auditors"
    )
