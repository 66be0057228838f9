"""Certified Newton unlearning for deep networks (seed 004, Algorithms 1–2).

w̃ = w − (H + λI)⁻¹·∇L(w, D_r) by LiSSA from the current noise-free state (sequential requests
continue from it, Algorithm 2), projected back onto ‖w‖ ≤ C (free: projection onto a convex set
containing the retrained model never increases the distance to it), released with Gaussian noise
from the analytic mechanism on Proposition 4.1's corrected Δ. LiSSA's failure probability ρ is
added to δ. L, M and λ_min are declared; G, ‖H‖ and λ_min are measured and recorded.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from app.privacy.sensitivity import lissa_min_depth, newton_sensitivity
from app.privacy.validate import PrivacyParameterError
from app.states import Guarantee
from maths.nets import FlatModel, build_net
from maths.norms import clip_vector
from methods.compute import (
    CertificateFields,
    Constant,
    Release,
    RetainedData,
    TargetInfeasible,
    UnlearningMethod,
    UpdateInputs,
    register,
)
from methods.newton.maths import LissaDiverged, hessian_extremes, lissa, mean_gradient
from methods.newton.spec import SPEC, NewtonOptions
from methods.noise import check_relative_noise, draw_gaussian, secure_generator


@register
class Newton(UnlearningMethod):
    spec = SPEC

    @property
    def o(self) -> NewtonOptions:
        return self.model.method.options

    def projection_radius(self) -> float | None:
        """Projected training onto ‖w‖ ≤ C (note 004 §2.1); retraining does the same."""
        return self.o.C

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        data, removed, target = inputs.retained, inputs.removed, inputs.target
        o, wd = self.o, self.model.training.weight_decay
        model = FlatModel(
            build_net(self.model.architecture, self.model.n_features, self.model.n_classes)
        )
        w = model.vector(inputs.state)
        n_r, n_u = len(data.y), len(removed.y)
        X_all, y_all = torch.cat([data.X, removed.X]), torch.cat([data.y, removed.y])
        grad_all = mean_gradient(model, w, X_all, y_all, wd)
        grad_r = mean_gradient(model, w, data.X, data.y, wd)
        shortcut = float(grad_all.norm()) <= o.residual_tolerance
        # At a stationary point ∇L(w, D_r) = −(n_u/n_r)·∇L(w, D_u) (seed 004 Eq. 10), L2 included.
        v = -(n_u / n_r) * mean_gradient(model, w, removed.X, removed.y, wd) if shortcut else grad_r
        G = max(float(grad_all.norm()), float(grad_r.norm()))
        lam, scale, ihvp, ratio, attempts = self._solve(model, w, v, data)
        w_tilde = clip_vector(w - ihvp, o.C)
        h_max, h_min = hessian_extremes(
            model, w, data.X, data.y, wd, o.power_iterations, secure_generator()
        )
        compute_seconds = time.perf_counter() - start
        rho = o.rho if o.rho is not None else target.delta / 2
        if rho >= target.delta:
            raise TargetInfeasible(f"LiSSA failure probability ρ={rho:g} ≥ δ={target.delta:g}")
        try:
            sensitivity = newton_sensitivity(
                o.C, o.M, o.L, lam, o.lam_min, G, d=w.numel(), rho=rho, s=o.depth
            )
        except PrivacyParameterError as exc:
            raise TargetInfeasible(f"Proposition 4.1 does not apply: {exc}") from exc
        delta_mech = target.delta - rho
        sigma = sigma_for(sensitivity, target.epsilon, delta_mech)
        check_relative_noise(
            sigma, sensitivity, w.numel(), float(w_tilde.norm()), o.max_relative_noise
        )
        noise = sigma * draw_gaussian(w.shape, secure_generator(), w.dtype, w.device)
        epsilon = epsilon_for(sensitivity, sigma, delta_mech)
        measured = {
            "G": G,
            "hessian_norm": max(abs(h_max), abs(h_min)),
            "lam_min": h_min,
            "lissa_ratio": ratio,
            "lam": lam,
            "H_sc": scale,
            "attempts": attempts,
            "shortcut": shortcut,
        }
        cert = self._certificate(epsilon, delta_mech, rho, sigma, sensitivity, n_u, measured)
        assert cert.epsilon is not None and cert.delta is not None
        return Release(
            next_state=model.state(w_tilde),
            weights=model.state(w_tilde + noise),
            certificate=cert,
            event=gaussian_event(sigma, sensitivity, cert.epsilon, cert.delta),
            statistics_to_delete=list(removed.sample_ids),
            metrics={
                "unlearn_compute_seconds": compute_seconds,
                "sigma": sigma,
                "sensitivity": sensitivity,
                **{f"measured_{k}": v for k, v in measured.items()},
            },
        )

    def _solve(
        self, model: FlatModel, w: torch.Tensor, v: torch.Tensor, data: RetainedData
    ) -> tuple[float, float, torch.Tensor, float, int]:
        """LiSSA with the divergence guard: on divergence raise λ or H_sc as configured and
        retry; after `guard_retries` the update never ships (TargetInfeasible)."""
        o = self.o
        lam, scale = o.lam, o.H_sc
        gen = secure_generator()
        last: LissaDiverged | None = None
        for attempt in range(o.guard_retries + 1):
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
                else:
                    lam = lam * 10 if lam > 0 else 1.0
        raise TargetInfeasible(
            f"LiSSA diverged after {o.guard_retries + 1} attempt(s) "
            f"(last λ={lam:g}, H_sc={scale:g}): {last}"
        )

    def _certificate(
        self,
        epsilon: float,
        delta_mech: float,
        rho: float,
        sigma: float,
        sensitivity: float,
        n: int,
        m: dict[str, Any],
    ) -> CertificateFields:
        o = self.o
        condition = m["lam"] > m["hessian_norm"]
        depth_ok = o.depth >= lissa_min_depth(o.L, m["lam"], o.lam_min)
        sentence = (
            f"(ε={epsilon:.4g}, δ={delta_mech + rho:.3g})-indistinguishable from "
            f"retraining without these {n} samples inside ‖w‖ ≤ C={o.C:g} plus the "
            f"same noise σ={sigma:.4g}, with probability 1−ρ over LiSSA (ρ={rho:.3g}, "
            f"included in δ), provided the declared constants hold: L={o.L:g}, "
            f"M={o.M:g}, λ_min={o.lam_min:g}, and ‖∇L(w̃*, D_r)‖ ≤ G="
            f"{m['G']:.4g} (measured on the current model)."
        )
        if not condition:
            sentence += (
                f" The theorem's condition λ > ‖H‖ FAILS: λ={m['lam']:g} but the "
                f"measured ‖H‖ is {m['hessian_norm']:.4g}."
            )
        if m["lam_min"] < o.lam_min:
            sentence += (
                f" The measured λ_min={m['lam_min']:.4g} is below the declared {o.lam_min:g}."
            )
        constants = {
            "C": Constant(o.C, "declared", "parameter-norm ball, enforced by projection"),
            "L": Constant(o.L, "declared", "gradient-Lipschitz constant (Assumption 3.1)"),
            "M": Constant(o.M, "declared", "Hessian-Lipschitz constant (Assumption 3.2)"),
            "lam_min": Constant(o.lam_min, "declared", "smallest Hessian eigenvalue used in Δ"),
            "lam_min_measured": Constant(m["lam_min"], "measured", "power iteration on HVPs"),
            "hessian_norm": Constant(m["hessian_norm"], "measured", "‖H‖ by power iteration"),
            "G": Constant(m["G"], "measured", "max(‖∇L(w, D)‖, ‖∇L(w, D_r)‖)"),
            "lambda": Constant(m["lam"], "declared", "local convex coefficient used"),
            "H_sc": Constant(m["H_sc"], "declared", "LiSSA scale used"),
            "s": Constant(
                o.depth,
                "declared",
                "LiSSA depth" + ("" if depth_ok else " (BELOW the 2κ ln κ condition)"),
            ),
            "rho": Constant(rho, "declared", "LiSSA failure probability, added to δ"),
        }
        return CertificateFields(
            guarantee=Guarantee.conditional,
            epsilon=epsilon,
            delta=delta_mech + rho,
            sigma=sigma,
            sensitivity=sensitivity,
            accountant="analytic Gaussian mechanism (Balle & Wang "
            "2018) on seed 004 Proposition 4.1 (corrected), δ = δ_Gauss + ρ",
            sentence=sentence,
            constants=constants,
            compares="release vs. projected retraining without the removed samples plus the "
            "same noise (seed 004 Definition 2.1)",
        )
