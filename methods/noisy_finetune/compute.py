"""Certified noisy fine-tuning (seed 002): gradient clipping (Theorem A.9, privacy
amplification by iteration) and model clipping (Theorem 4.2, hockey-stick contraction).

From Π_C0(x̂), T noisy SGD steps on retained data only, fresh N(0, σ²I) each step, then
optional noiseless fine-tuning with a fresh optimizer (post-processing). Rigorous: no constant
of the loss is assumed. The next update starts from this release (a fresh mechanism each
time: the 2·C0 worst case covers any starting point); the lineage composes the releases.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch import nn
from torch.func import grad

from app.core import shutdown
from app.core.states import Guarantee
from app.privacy.lineage import SlopeRelease
from app.privacy.plans import ReleasePlan
from maths.nets import FlatModel, build_net
from maths.norms import clip_vector
from maths.training import finetune
from methods.compute import (
    CertificateFields,
    Constant,
    PublicInfeasible,
    Release,
    RetainedData,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.noise import draw_gaussian, secure_generator
from methods.noisy_finetune.spec import SPEC, NoisyFinetuneOptions


@register
class NoisyFinetune(UnlearningMethod):
    spec = SPEC

    @property
    def o(self) -> NoisyFinetuneOptions:
        return self.model.method.options

    def unlearn(self, inputs: UpdateInputs) -> Release:
        data, target, m = inputs.retained, inputs.target, self.model
        if len(data.y) == 0:  # a count: public
            raise PublicInfeasible("no retained samples to fine-tune on")
        start = time.perf_counter()
        plan = self.spec.plan(self.o, target.epsilon, target.delta)
        if not plan.feasible or plan.steps is None:  # the options and the target
            raise PublicInfeasible(plan.reason)
        flat = FlatModel(build_net(m.architecture, m.n_features, m.n_classes))
        x = clip_vector(flat.vector(inputs.state), self.o.C0)
        noisy = self.noisy_phase(flat, x, data, plan.sigma, plan.steps)
        weights = finetune(
            m.architecture,
            m.training,
            m.n_classes,
            flat.state(noisy),
            data.X,
            data.y,
            self.o.finetune_epochs,
            self.o.finetune_learning_rate,
            interrupt=shutdown.check,
        )
        return Release(
            next_state=weights,
            weights=weights,
            certificate=self._certificate(plan, len(inputs.removed.sample_ids)),
            event=plan.event,
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "noisy_steps": plan.steps,
                "sigma": plan.sigma,
                "noisy_phase_norm": float(noisy.norm()),
                "finetune_epochs": self.o.finetune_epochs,
            },
        )

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release:
        """The same noisy fine-tuning from the model retrained without the removed samples:
        the procedure the certificate compares with (seed 002, Definition 2.1), so neither
        the release nor its certificate says the method's own run failed."""
        return self.unlearn(replace(inputs, state=exact.next_state, resident=None))

    def noisy_phase(
        self, model: FlatModel, x: torch.Tensor, data: RetainedData, sigma: float, steps: int
    ) -> torch.Tensor:
        """Eq. (3) (gradient clipping) or eq. (4) (model clipping) for `steps` steps, on the
        device of x and the data (noise and batches drawn on CPU, then moved)."""
        o = self.o
        noise, batches = secure_generator(), secure_generator()
        device = x.device

        def loss(w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(model.logits(w, X), y)

        gradient = grad(loss)
        if o.variant == "model_clipping" and o.sigma0 > 0:
            x = x + o.sigma0 * draw_gaussian(x.shape, noise, x.dtype, device)
        size = min(o.batch_size, len(data.y))
        for _ in range(steps):
            idx = torch.randint(len(data.y), (size,), generator=batches, device=batches.device)
            idx = idx.to(data.X.device)
            g = gradient(x, data.X[idx], data.y[idx])
            if o.variant == "gradient_clipping":
                x = x - o.gamma * (clip_vector(g, o.C1) + o.lam * x)
            else:
                x = clip_vector(x - o.gamma * (g + o.lam * x), o.C2)
            x = x + sigma * draw_gaussian(x.shape, noise, x.dtype, device)
        return x

    def _certificate(self, plan: ReleasePlan, n: int) -> CertificateFields:
        o, event = self.o, plan.event
        assert event is not None
        slope = event.slope if isinstance(event, SlopeRelease) else 0.0
        theorem = (
            "Theorem A.9 (privacy amplification by iteration, Rényi slope "
            f"R={slope:.4g} converted with the slope counted)"
            if o.variant == "gradient_clipping"
            else "Theorem 4.2 (hockey-stick contraction, ε fixed, δ shrinking)"
        )
        sentence = (
            f"(ε={event.epsilon:.4g}, δ={event.delta:.3g})-indistinguishable from "
            f"running the same procedure on a model retrained without {these_samples(n)}:"
            f" {o.variant.replace('_', ' ')} with {plan.steps} noisy steps at "
            f"σ={plan.sigma:.4g} on retained data only, by seed 002 {theorem}"
            + (
                f", then {o.finetune_epochs} noiseless epochs on retained data"
                if o.finetune_epochs
                else ""
            )
            + ". No unverifiable constant is assumed."
        )
        constants = {
            k: Constant(v["value"], "declared", v["meaning"]) for k, v in plan.constants.items()
        }
        constants["T"] = Constant(float(plan.steps or 0), "declared", "noisy steps")
        return CertificateFields(
            guarantee=Guarantee.rigorous,
            epsilon=event.epsilon,
            delta=event.delta,
            sigma=plan.sigma,
            sensitivity=plan.sensitivity,
            accountant=f"seed 002 {theorem} via methods.noisy_finetune.accountant",
            sentence=sentence,
            constants=constants,
            compares="release vs. the same procedure on the model retrained without the "
            "removed samples (seed 002, Definition 2.1)",
        )
