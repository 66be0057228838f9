"""Certified noisy fine-tuning (seed 002): gradient clipping (Theorem A.9, privacy
amplification by iteration) and model clipping (Theorem 4.2, hockey-stick contraction).

From Π_C0(x̂), T noisy SGD steps on retained data only, fresh N(0, σ²I) each step, then
optional noiseless fine-tuning with a fresh optimizer (post-processing). Rigorous: no constant
of the loss is assumed. The next update starts from this release (a fresh mechanism each
time: the 2·C0 worst case covers any starting point); the lineage composes the releases.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.func import grad

from app.privacy.plans import release_plan
from workers.methods.base import (
    CertificateFields,
    Constant,
    ModelSpec,
    ModelState,
    PrivacyTarget,
    RemovedSamples,
    RetainedData,
    TargetInfeasible,
    Update,
)
from workers.methods.noise import clip_vector, secure_generator
from workers.nets import FlatModel, build_net
from workers.training import finetune


class Method:
    name = "noisy_finetune"
    guarantee = "rigorous"
    needs_retained_data = True

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.o = spec.method

    def unlearn(
        self,
        state: ModelState,
        removed: RemovedSamples,
        target: PrivacyTarget,
        data: RetainedData | None,
    ) -> Update:
        assert data is not None and len(data.y) > 0
        start = time.perf_counter()
        plan = release_plan(self.o, target.epsilon, target.delta)
        if not plan.feasible:
            raise TargetInfeasible(plan.reason)
        model = FlatModel(
            build_net(self.spec.architecture, self.spec.n_features, self.spec.n_classes)
        )
        x = clip_vector(model.vector(state), self.o["C0"])
        noisy = self.noisy_phase(model, x, data, plan.sigma, plan.steps)
        release = model.state(noisy)
        release = finetune(
            self.spec,
            release,
            data.X,
            data.y,
            self.o["finetune_epochs"],
            self.o["finetune_learning_rate"],
        )
        cert = self._certificate(plan, len(removed.sample_ids))
        return Update(
            next_state=release,
            release=release,
            certificate=cert,
            statistics_to_delete=list(removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "noisy_steps": plan.steps,
                "sigma": plan.sigma,
                "noisy_phase_norm": float(noisy.norm()),
                "finetune_epochs": self.o["finetune_epochs"],
            },
        )

    def noisy_phase(
        self, model: FlatModel, x: torch.Tensor, data: RetainedData, sigma: float, steps: int
    ) -> torch.Tensor:
        """Eq. (3) (gradient clipping) or eq. (4) (model clipping) for `steps` steps."""
        o = self.o
        noise = secure_generator()
        batches = torch.Generator().manual_seed(int(time.time_ns()) % 2**63)

        def loss(w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(model.logits(w, X), y)

        gradient = grad(loss)
        if o["variant"] == "model_clipping" and o["sigma0"] > 0:
            x = x + o["sigma0"] * torch.randn(x.shape, generator=noise)
        for _ in range(steps):
            idx = torch.randint(
                len(data.y), (min(o["batch_size"], len(data.y)),), generator=batches
            )
            g = gradient(x, data.X[idx], data.y[idx])
            if o["variant"] == "gradient_clipping":
                x = x - o["gamma"] * (clip_vector(g, o["C1"]) + o["lam"] * x)
            else:
                x = clip_vector(x - o["gamma"] * (g + o["lam"] * x), o["C2"])
            x = x + sigma * torch.randn(x.shape, generator=noise)
        return x

    def _certificate(self, plan, n: int) -> CertificateFields:  # noqa: ANN001
        o, event = self.o, plan.event
        theorem = (
            "Theorem A.9 (privacy amplification by iteration, Rényi slope "
            f"R={event.get('slope', 0):.4g} converted with the slope counted)"
            if o["variant"] == "gradient_clipping"
            else "Theorem 4.2 (hockey-stick contraction, ε fixed, δ shrinking)"
        )
        sentence = (
            f"(ε={event['epsilon']:.4g}, δ={event['delta']:.3g})-indistinguishable from "
            f"running the same procedure on a model retrained without these {n} samples:"
            f" {o['variant'].replace('_', ' ')} with {plan.steps} noisy steps at "
            f"σ={plan.sigma:.4g} on retained data only, by seed 002 {theorem}"
            + (
                f", then {o['finetune_epochs']} noiseless epochs on retained data"
                if o["finetune_epochs"]
                else ""
            )
            + ". No unverifiable constant is assumed."
        )
        constants = {
            k: Constant(v["value"], "declared", v["meaning"]) for k, v in plan.constants.items()
        }
        constants["T"] = Constant(plan.steps, "declared", "noisy steps")
        return CertificateFields(
            guarantee="rigorous",
            epsilon=event["epsilon"],
            delta=event["delta"],
            sigma=plan.sigma,
            sensitivity=plan.sensitivity,
            accountant=f"seed 002 {theorem} via app.privacy.noisy_finetune",
            sentence=sentence,
            constants=constants,
            lineage_event=event,
            compares="release vs. the same procedure on the model retrained without the "
            "removed samples (seed 002, Definition 2.1)",
        )
