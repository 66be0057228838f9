"""Output perturbation (seed 002 eq. 1): release Π_C0(x̂) + N(0, σ²I) with σ from the analytic
Gaussian on Δ = 2·C0, optionally followed by noiseless fine-tuning on the retained data.

Rigorous: any two models in the C0 ball are at most 2·C0 apart, so the release is
(ε, δ)-indistinguishable from the same procedure run on a model trained without the removed
samples, whatever the loss. The noise-free state stays the clipped model; every release draws
fresh noise and the lineage accountant composes the releases.
"""

from __future__ import annotations

import time
from dataclasses import replace

from app.core import shutdown
from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for
from app.privacy.lineage import gaussian_event
from maths.norms import clip_to_ball, global_norm
from maths.training import finetune
from methods.compute import (
    CertificateFields,
    Constant,
    PublicInfeasible,
    Release,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.noise import add_gaussian, secure_generator
from methods.output_perturbation.spec import SPEC, OutputPerturbationOptions


@register
class OutputPerturbation(UnlearningMethod):
    spec = SPEC

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        o: OutputPerturbationOptions = self.model.method.options
        target, m = inputs.target, self.model
        plan = self.spec.plan(o, target.epsilon, target.delta)
        if not plan.feasible:  # a function of the options and the target
            raise PublicInfeasible(plan.reason or "σ below the numerical floor")
        base = clip_to_ball(inputs.state, o.C0)
        noisy = add_gaussian(base, plan.sigma, secure_generator())
        data = inputs.retained  # read only to fine-tune: the release alone reads no row
        weights = (
            finetune(
                m.architecture,
                m.training,
                m.n_classes,
                noisy,
                data.X,
                data.y,
                o.finetune_epochs,
                o.finetune_learning_rate,
                interrupt=shutdown.check,
            )
            if o.finetune_epochs
            else noisy
        )
        n = len(inputs.removed.sample_ids)
        epsilon = epsilon_for(plan.sensitivity, plan.sigma, target.delta)
        sentence = (
            f"(ε={epsilon:.4g}, δ={target.delta:.3g})-indistinguishable from "
            f"running the same procedure on a model retrained without {these_samples(n)}: "
            f"the model was clipped to norm C0={o.C0:g} and Gaussian noise "
            f"σ={plan.sigma:.4g} was added (sensitivity Δ=2·C0={plan.sensitivity:g}, "
            "analytic Gaussian mechanism)"
            + (
                f", then fine-tuned {o.finetune_epochs} epochs on retained data only"
                if o.finetune_epochs
                else ""
            )
            + ". No unverifiable constant is assumed."
        )
        cert = CertificateFields(
            guarantee=Guarantee.rigorous,
            epsilon=epsilon,
            delta=target.delta,
            sigma=plan.sigma,
            sensitivity=plan.sensitivity,
            accountant="analytic Gaussian mechanism (Balle & Wang 2018) via dp-accounting",
            sentence=sentence,
            constants={
                "C0": Constant(o.C0, "declared", "clipping radius, enforced by projection"),
                "clipped_norm": Constant(
                    global_norm(base.values()),
                    "measured",
                    "‖Π_C0(x)‖ of the noise-free state",
                    "auditors",  # a noise-free function of the data
                    f"≤ C0 = {o.C0:g}",
                ),
            },
            compares="release vs. the same procedure on the model retrained without the "
            "removed samples (seed 002, Definition 2.1)",
        )
        return Release(
            next_state=base,
            weights=weights,
            certificate=cert,
            event=gaussian_event(plan.sigma, plan.sensitivity, epsilon, target.delta),
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={"unlearn_seconds": time.perf_counter() - start, "sigma": plan.sigma},
        )

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release:
        """The same procedure on the model retrained without the removed samples: exactly
        what the certificate compares with (seed 002, Definition 2.1), so the release and its
        certificate do not say that the method's own update failed."""
        return self.unlearn(replace(inputs, state=exact.next_state, resident=None))
