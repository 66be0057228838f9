"""minnorm_og: MinNorm-OG (seed 001, Algorithm 1, in the order and schedule of Appendix
F.1.10). A heuristic: the certificate says guarantee `none`, ε and δ null, and why.

θ is every trainable parameter. For each of the ⌈|D_f|/n_B⌉ forget batches of an epoch: one
AdamW step on the next retained batch (cyclic over a seeded order), then, when
t % T_Proj = 0 and t < T − T_GD, the closed-form step of Appendix E,
θ ← θ − κ(θ − QQᵀθ), Q an orthonormal basis (SVD, rank cut-off) of the gradients of the
logit of each sample's class predicted by the original model (OGD's surrogate), for the
batch's first n_pert samples; κ ← γκ after each projection. The removed samples' features
are never used: only their number sizes the work.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.func import grad, vmap

from app.core.states import Guarantee
from maths.nets import FlatModel, build_net
from methods.compute import (
    CertificateFields,
    Constant,
    Release,
    UnlearningMethod,
    UpdateInputs,
    register,
)
from methods.minnorm_og.spec import SPEC, MinNormOGOptions


def orthonormal_basis(G: torch.Tensor, rank_tolerance: float) -> torch.Tensor:
    """Q (d × r): the left singular vectors of G (d × k) above the relative cut-off."""
    U, S, _ = torch.linalg.svd(G, full_matrices=False)
    if S.numel() == 0 or float(S[0]) == 0.0:
        return U[:, :0]
    return U[:, rank_tolerance * S[0] < S]


def project_step(w: torch.Tensor, Q: torch.Tensor, kappa: float) -> torch.Tensor:
    """θ − κ(θ − QQᵀθ): the minimiser of ‖θ + Δ‖² + λ‖Δ‖² over Δ ⊥ span(Q), κ = 1/(1+λ)
    (seed 001, Appendix E)."""
    return w - kappa * (w - Q @ (Q.T @ w))


@register
class MinNormOG(UnlearningMethod):
    spec = SPEC

    @property
    def options(self) -> MinNormOGOptions:
        return self.model.method.options

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        o, m = self.options, self.model
        X, y = inputs.retained.X, inputs.retained.y
        net = build_net(m.architecture, m.n_features, m.n_classes).to(X.device)
        net.load_state_dict({k: inputs.state[k] for k in net.state_dict()})
        flat = FlatModel(net)
        with torch.no_grad():
            # the original model's classes, held constant, as one-hot selectors
            predicted = nn.functional.one_hot(net(X).argmax(1), m.n_classes).to(X.dtype)

        def logit(w: torch.Tensor, x: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
            return (flat.logits(w, x.unsqueeze(0))[0] * pick).sum()

        output_grads = vmap(grad(logit), in_dims=(None, 0, 0))
        opt = torch.optim.AdamW(net.parameters(), lr=o.learning_rate, weight_decay=o.weight_decay)
        gen = torch.Generator().manual_seed(o.seed)
        order = torch.randperm(len(y), generator=gen, device=gen.device).to(X.device)
        batches = max(1, math.ceil(len(inputs.removed.sample_ids) / o.batch_size))
        cursor, kappa, projections, loss_fn = 0, o.kappa, 0, nn.CrossEntropyLoss()
        net.train()
        for t in range(o.epochs):
            for _ in range(batches):
                idx = order[(torch.arange(o.batch_size, device=X.device) + cursor) % len(y)]
                cursor = (cursor + o.batch_size) % len(y)
                opt.zero_grad(set_to_none=True)
                loss_fn(net(X[idx]), y[idx]).backward()
                opt.step()
                if t % o.projection_every == 0 and t < o.epochs - o.descent_only_epochs:
                    pert = idx[: o.n_pert]
                    with torch.no_grad():
                        w = flat.flat()
                        G = output_grads(w, X[pert], predicted[pert]).T  # d × n_pert
                        w = project_step(w, orthonormal_basis(G, o.rank_tolerance), kappa)
                        torch.nn.utils.vector_to_parameters(w, net.parameters())
                    kappa *= o.gamma
                    projections += 1
        state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
        n = len(inputs.removed.sample_ids)
        sentence = (
            f"No privacy claim is made. MinNorm-OG (seed 001, Algorithm 1 with the schedule of "
            f"Appendix F.1.10) moved the model towards the minimum-norm solution on "
            f"{len(y)} retained samples ({o.epochs} epochs, {projections} projections) after "
            f"removing {n} samples, but it adds no noise and bounds no distance to a retrained "
            "model: the paper proves exactness only for linear models and gives deep networks "
            "no guarantee (seed 001 §B.6), so the released model may still carry information "
            "about the removed samples. It ran because the model's policy allows heuristics."
        )
        cert = CertificateFields(
            guarantee=Guarantee.none,
            epsilon=None,
            delta=None,
            sigma=0.0,
            sensitivity=0.0,
            accountant="none (heuristic)",
            sentence=sentence,
            constants={
                "kappa": Constant(o.kappa, "declared", "first projection strength κ₀ = λ_reg"),
                "gamma": Constant(o.gamma, "declared", "decay of κ per projection"),
                "projections": Constant(float(projections), "measured", "projection steps"),
            },
            compares="nothing: a heuristic makes no claim against retraining",
        )
        return Release(
            next_state=state,
            weights=state,
            certificate=cert,
            event=None,
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "projections": projections,
                "final_kappa": kappa,
                "steps": o.epochs * batches,
            },
        )
