"""Certified Newton unlearning for deep networks (seed 004, Algorithms 1–2).

w̃ = w − (H + λI)⁻¹·∇L(w, D_r) by LiSSA from the current noise-free state (sequential requests
continue from it, Algorithm 2), projected back onto ‖w‖ ≤ C (free: projection onto a convex set
containing the retrained model never increases the distance to it), released with Gaussian noise
from the analytic mechanism on Proposition 4.1's corrected Δ. LiSSA's failure probability ρ is
added to δ. L, M and λ_min are declared; G, ‖H‖ and λ_min are measured and recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from app.privacy.validate import PrivacyParameterError
from maths.nets import FlatModel, build_net
from maths.norms import clip_vector
from methods.compute import (
    CertificateFields,
    Constant,
    PublicInfeasible,
    Release,
    RetainedData,
    TargetInfeasible,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.newton.maths import LissaDiverged, hessian_extremes, lissa, mean_gradient
from methods.newton.sensitivity import lissa_min_depth, newton_sensitivity
from methods.newton.spec import SPEC, NewtonOptions
from methods.noise import check_relative_noise, draw_gaussian, secure_generator


@dataclass(frozen=True)
class NoisePlan:
    """What the release's noise is, from the options, the target and d alone."""

    lams: tuple[float, ...]  # the λ the divergence guard may use, in order
    rho: float
    delta_mech: float
    sensitivity: float  # the largest Δ over `lams`
    sigma: float


@register
class Newton(UnlearningMethod):
    spec = SPEC

    @property
    def o(self) -> NewtonOptions:
        return self.model.method.options

    def projection_radius(self) -> float | None:
        """Projected training onto ‖w‖ ≤ C (note 004 §2.1); retraining does the same."""
        return self.o.C

    def plan(self, inputs: UpdateInputs, d: int) -> NoisePlan:
        """Δ (Proposition 4.1, corrected) at the declared G_max for every λ the guard may
        try, and σ for the largest: public, so σ says nothing of the rows (PublicInfeasible
        when the options cannot meet the target)."""
        o, target = self.o, inputs.target
        rho = o.rho if o.rho is not None else target.delta / 2
        if rho >= target.delta:
            raise PublicInfeasible(f"LiSSA failure probability ρ={rho:g} ≥ δ={target.delta:g}")
        lams = [o.lam]
        if o.guard_raise == "lam":
            for _ in range(o.guard_retries):
                lams.append(lams[-1] * 10 if lams[-1] > 0 else 1.0)
        usable: list[tuple[float, float]] = []
        for lam in lams:
            try:
                args = (o.C, o.M, o.L, lam, o.lam_min, o.G_max)
                usable.append((lam, newton_sensitivity(*args, d=d, rho=rho, s=o.depth)))
            except PrivacyParameterError as exc:
                if not usable:
                    raise PublicInfeasible(f"Proposition 4.1 does not apply: {exc}") from exc
                break  # the guard stops before a λ the theorem does not cover
        sensitivity = max(delta for _, delta in usable)
        sigma = sigma_for(sensitivity, target.epsilon, target.delta - rho)
        try:
            check_relative_noise(sigma, sensitivity, d, o.C, o.max_relative_noise)
        except TargetInfeasible as exc:  # σ and C are public: so is this refusal
            raise PublicInfeasible(str(exc)) from exc
        return NoisePlan(
            tuple(lam for lam, _ in usable), rho, target.delta - rho, sensitivity, sigma
        )

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        data, removed = inputs.retained, inputs.removed
        o, wd = self.o, self.model.training.weight_decay
        model = self._flat()
        w = model.vector(inputs.state)
        plan = self.plan(inputs, w.numel())
        n_r, n_u = len(data.y), len(removed.y)
        X_all, y_all = torch.cat([data.X, removed.X]), torch.cat([data.y, removed.y])
        grad_all = mean_gradient(model, w, X_all, y_all, wd)
        grad_r = mean_gradient(model, w, data.X, data.y, wd)
        residual = max(float(grad_all.norm()), float(grad_r.norm()))
        if residual > o.G_max:  # a function of the rows: the retrain goes through the mechanism
            raise TargetInfeasible(
                f"the measured G={residual:.4g} exceeds the declared G_max={o.G_max:g}"
            )
        shortcut = float(grad_all.norm()) <= o.residual_tolerance
        # At a stationary point ∇L(w, D_r) = −(n_u/n_r)·∇L(w, D_u) (seed 004 Eq. 10), L2 included.
        v = -(n_u / n_r) * mean_gradient(model, w, removed.X, removed.y, wd) if shortcut else grad_r
        lam, scale, ihvp, ratio, attempts = self._solve(model, w, v, data, plan.lams)
        w_tilde = clip_vector(w - ihvp, o.C)
        h_max, h_min = hessian_extremes(
            model, w, data.X, data.y, wd, o.power_iterations, secure_generator()
        )
        measured = {
            "G": residual,
            "hessian_norm": max(abs(h_max), abs(h_min)),
            "lam_min": h_min,
            "lissa_ratio": ratio,
            "lam": lam,
            "H_sc": scale,
            "attempts": attempts,
            "shortcut": shortcut,
        }
        return self._released(model, w_tilde, plan, n_u, measured, start, list(removed.sample_ids))

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release:
        """The projected retrain with the same noise and certificate: exactly what
        the certificate compares with (seed 004 Definition 2.1), so the release does not say
        that the Newton step could not be certified."""
        start = time.perf_counter()
        model = self._flat()
        w = model.vector(exact.next_state)
        plan = self.plan(inputs, w.numel())
        h_max, h_min = hessian_extremes(
            model,
            w,
            inputs.retained.X,
            inputs.retained.y,
            self.model.training.weight_decay,
            self.o.power_iterations,
            secure_generator(),
        )
        measured = {
            "G": float(
                mean_gradient(
                    model, w, inputs.retained.X, inputs.retained.y, self.model.training.weight_decay
                ).norm()
            ),
            "hessian_norm": max(abs(h_max), abs(h_min)),
            "lam_min": h_min,
            "lam": plan.lams[0],
            "H_sc": self.o.H_sc,
            "attempts": 0,
        }
        n_u = len(inputs.removed.sample_ids)
        released = self._released(
            model, w, plan, n_u, measured, start, list(inputs.removed.sample_ids)
        )
        return replace(released, next_state=exact.next_state)

    def _flat(self) -> FlatModel:
        return FlatModel(
            build_net(self.model.architecture, self.model.n_features, self.model.n_classes)
        )

    def _released(
        self,
        model: FlatModel,
        w_tilde: torch.Tensor,
        plan: NoisePlan,
        n_u: int,
        measured: dict[str, Any],
        start: float,
        removed_ids: list[int],
    ) -> Release:
        """w̃ + N(0, σ²I) with the plan's σ, and its certificate."""
        noise = plan.sigma * draw_gaussian(
            w_tilde.shape, secure_generator(), w_tilde.dtype, w_tilde.device
        )
        epsilon = epsilon_for(plan.sensitivity, plan.sigma, plan.delta_mech)
        cert = self._certificate(epsilon, plan, n_u, measured)
        assert cert.epsilon is not None and cert.delta is not None
        return Release(
            next_state=model.state(w_tilde),
            weights=model.state(w_tilde + noise),
            certificate=cert,
            event=gaussian_event(plan.sigma, plan.sensitivity, cert.epsilon, cert.delta),
            statistics_to_delete=removed_ids,
            metrics={
                "unlearn_compute_seconds": time.perf_counter() - start,
                "sigma": plan.sigma,
                "sensitivity": plan.sensitivity,
                **{f"measured_{k}": v for k, v in measured.items()},
            },
        )

    def _solve(
        self,
        model: FlatModel,
        w: torch.Tensor,
        v: torch.Tensor,
        data: RetainedData,
        lams: tuple[float, ...],
    ) -> tuple[float, float, torch.Tensor, float, int]:
        """LiSSA with the divergence guard: on divergence raise H_sc, or λ along the plan's
        public sequence, and retry; after `guard_retries` the Newton step cannot be certified
        (TargetInfeasible: the retrain goes through the mechanism)."""
        o = self.o
        scale = o.H_sc
        gen = secure_generator()
        last: LissaDiverged | None = None
        lam = lams[0]
        for attempt in range(o.guard_retries + 1):
            if o.guard_raise == "lam":
                if attempt >= len(lams):
                    break
                lam = lams[attempt]
            try:
                result = lissa(
                    model,
                    w,
                    v,
                    data.X,
                    data.y,
                    lam=lam,
                    scale=scale,
                    depth=o.depth,
                    chains=o.chains,
                    batch=o.hvp_batch,
                    weight_decay=self.model.training.weight_decay,
                    gen=gen,
                    guard=o.guard,
                )
                return lam, scale, result.ihvp, result.max_ratio, attempt + 1
            except LissaDiverged as exc:
                last = exc
                if o.guard_raise == "H_sc":
                    scale *= 4
        raise TargetInfeasible(
            f"LiSSA diverged after {o.guard_retries + 1} attempt(s) "
            f"(last λ={lam:g}, H_sc={scale:g}): {last}"
        )

    def _certificate(
        self, epsilon: float, plan: NoisePlan, n: int, m: dict[str, Any]
    ) -> CertificateFields:
        """The same public fields whichever branch made w̃: declared constants in the
        sentence, the measured ones (functions of the rows) for auditors only."""
        o = self.o
        sentence = (
            f"(ε={epsilon:.4g}, δ={plan.delta_mech + plan.rho:.3g})-indistinguishable from "
            f"retraining without {these_samples(n)} inside ‖w‖ ≤ C={o.C:g} plus the "
            f"same noise σ={plan.sigma:.4g}, with probability 1−ρ over LiSSA "
            f"(ρ={plan.rho:.3g}, included in δ), provided the declared constants hold: "
            f"L={o.L:g}, M={o.M:g}, λ_min={o.lam_min:g}, λ > ‖H‖ (the theorem's condition) "
            f"and ‖∇L(w̃*, D_r)‖ ≤ G_max={o.G_max:g}. The measured ‖H‖ and λ_min are "
            "shown to auditors."
        )
        auditors = "measured; a function of the rows, shown to auditors"

        def condition(holds: bool, meaning: str) -> Constant:
            return Constant(float(holds), "measured", meaning, "auditors", auditors)

        constants = {
            "C": Constant(o.C, "declared", "parameter-norm ball, enforced by projection"),
            "L": Constant(o.L, "declared", "gradient-Lipschitz constant (Assumption 3.1)"),
            "M": Constant(o.M, "declared", "Hessian-Lipschitz constant (Assumption 3.2)"),
            "lam_min": Constant(o.lam_min, "declared", "smallest Hessian eigenvalue used in Δ"),
            "G_max": Constant(o.G_max, "declared", "residual-gradient bound used in Δ"),
            "lambda": Constant(o.lam, "declared", "local convex coefficient declared"),
            "H_sc": Constant(o.H_sc, "declared", "LiSSA scale declared"),
            "s": Constant(o.depth, "declared", "LiSSA depth"),
            "rho": Constant(plan.rho, "declared", "LiSSA failure probability, added to δ"),
            "G": Constant(
                m["G"],
                "measured",
                "max(‖∇L(w, D)‖, ‖∇L(w, D_r)‖)",
                "auditors",
                f"≤ G_max = {o.G_max:g}",
            ),
            "lam_min_measured": Constant(
                m["lam_min"], "measured", "power iteration on HVPs", "auditors", auditors
            ),
            "hessian_norm": Constant(
                m["hessian_norm"], "measured", "‖H‖ by power iteration", "auditors", auditors
            ),
            "lambda_used": Constant(
                m["lam"],
                "measured",
                "λ after the divergence guard",
                "auditors",
                f"one of {list(plan.lams)}",
            ),
            "H_sc_used": Constant(
                m["H_sc"], "measured", "LiSSA scale after the guard", "auditors", auditors
            ),
            "lambda_over_hessian_norm": condition(
                m["lam"] > m["hessian_norm"],
                "1 if the theorem's condition λ > ‖H‖ holds, 0 if it FAILS",
            ),
            "lam_min_declared_holds": condition(
                m["lam_min"] >= o.lam_min,
                "1 if the measured λ_min is at least the declared one, 0 if it is BELOW",
            ),
            "depth_condition": condition(
                o.depth >= lissa_min_depth(o.L, m["lam"], o.lam_min),
                "1 if the depth s meets 2κ ln κ at the λ used, 0 if it is BELOW",
            ),
        }
        return CertificateFields(
            guarantee=Guarantee.conditional,
            epsilon=epsilon,
            delta=plan.delta_mech + plan.rho,
            sigma=plan.sigma,
            sensitivity=plan.sensitivity,
            accountant="analytic Gaussian mechanism (Balle & Wang "
            "2018) on seed 004 Proposition 4.1 (corrected) at the declared G_max and the "
            "largest λ the guard may use, δ = δ_Gauss + ρ",
            sentence=sentence,
            constants=constants,
            compares="release vs. projected retraining without the removed samples plus the "
            "same noise (seed 004 Definition 2.1)",
        )
