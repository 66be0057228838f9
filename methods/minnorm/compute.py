"""minnorm: exact unlearning of an overparameterized min-norm linear model (seed 001, Theorem
4.1): θ_r = P_{S_r} θ, the projection onto the span of the retained features, is the minimum-
norm interpolator of the retained data, which is what training on them alone returns.

The network's layers before the last are a fixed feature map (plain features, or frozen random
features); only the last layer θ = [W, b] is trained, in float64. The Gram inverse of the
training rows is kept in the noise-free state (never downloadable, purged with its version),
so a removal costs O(n²·m + p·n) instead of a fresh O(p·n²) solve (maths.py beside it).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from app.core.jsontypes import JsonObject
from app.core.states import Guarantee
from maths.nets import state_of
from maths.training import ProgressFn, seeded_net
from methods.compute import (
    CertificateFields,
    Constant,
    ModelState,
    Release,
    RetainedData,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.minnorm import maths as mn
from methods.minnorm.spec import SPEC, MinNormOptions

GRAM = "minnorm.gram_inverse"  # K⁻¹ of the rows below, float64 (n × n)
ROWS = "minnorm.sample_ids"  # the sample id of each row and column of K⁻¹


@register
class MinNorm(UnlearningMethod):
    spec = SPEC
    learns = True  # appended rows: a rank-k update of the Gram inverse

    @property
    def options(self) -> MinNormOptions:
        return self.model.method.options

    def _net(self, device: torch.device) -> nn.Sequential:
        m = self.model
        net = seeded_net(m.architecture, m.n_features, m.n_classes, m.training.seed, device)
        assert isinstance(net, nn.Sequential) and isinstance(net[-1], nn.Linear)
        return net

    def _layer(self, net: nn.Sequential) -> str:
        return str(len(net) - 1)

    @torch.no_grad()
    def _features(self, net: nn.Sequential, X: torch.Tensor) -> torch.Tensor:
        """Φ = [φ(x), 1] in float64, φ the layers before the trained one."""
        body = nn.Sequential(*list(net)[:-1]).to(X.device)
        return mn.with_bias(body(X.double()))

    def _state(self, net: nn.Sequential, theta: torch.Tensor) -> ModelState:
        layer = self._layer(net)
        return {
            **state_of(net),
            f"{layer}.weight": theta[:, :-1].contiguous().clone(),
            f"{layer}.bias": theta[:, -1].contiguous().clone(),
        }

    def _extra(self, fit: mn.MinNormFit, sample_ids: list[int], device: torch.device) -> ModelState:
        if fit.gram_inverse is None:  # dependent rows: every update solves afresh
            return {}
        rows = torch.tensor(sample_ids, dtype=torch.int64, device=device)
        return {GRAM: fit.gram_inverse.contiguous(), ROWS: rows}

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """The minimum-norm interpolator of one-hot labels, in float64."""
        start = time.perf_counter()
        net = self._net(data.X.device)
        phi = self._features(net, data.X)
        targets = nn.functional.one_hot(data.y, self.model.n_classes).double()
        fit = mn.fit(phi, targets, self.options.rank_tolerance)
        if progress is not None:
            progress(1, 1, fit.residual)
        metrics = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data.y),
            "parameters_per_output": phi.shape[1],
            "rank": fit.rank,
            "interpolation_residual": fit.residual,
            "gram_inverse_bytes": 0 if fit.gram_inverse is None else fit.gram_inverse.nbytes,
        }
        return Trained(
            state=self._state(net, fit.theta),
            statistics=None,
            record={},
            metrics=metrics,
            extra_state=self._extra(fit, data.sample_ids, data.X.device),
        )

    def unlearn(self, inputs: UpdateInputs) -> Release:
        """The minimum-norm solve on the retained labels: with K_r⁻¹ downdated from the stored
        K⁻¹ when the rows are independent (then it equals P_{S_r} θ, Theorem 4.1), else a fresh
        least-squares solve. Either way it is what `train` returns on the retained data; never
        a projection of θ, which differs from the retrain when rows are dependent."""
        start = time.perf_counter()
        o = self.options
        retained = inputs.retained
        net = self._net(retained.X.device)
        phi = self._features(net, retained.X)
        targets = nn.functional.one_hot(retained.y, self.model.n_classes).double()
        inverse, route = _downdated(inputs.state, retained.sample_ids, phi)
        fit: mn.MinNormFit | None = None
        if inverse is not None:
            fit = mn.solve_with(phi, inverse, targets, o.refine_steps)
            if fit.residual > o.residual_tolerance:
                route = f"fresh solve (the downdate's residual {fit.residual:.2g} was too large)"
                fit = None
        if fit is None:
            fit = mn.fit(phi, targets, o.rank_tolerance)  # what training does on these rows
            route = route if route.startswith("fresh") else "fresh solve"
        n = len(inputs.removed.sample_ids)
        sentence = (
            f"Exact: the released model is the minimum-norm least-squares solution on the "
            f"{len(phi)} retained samples' features and labels, which is what this model's "
            f"training returns on them alone (with independent rows it equals θ projected "
            f"onto their span, seed 001, Theorem 4.1), so it is (ε=0, δ=0)-indistinguishable "
            f"from retraining without {these_samples(n)}. Computed in float64 ({route}); "
            f"numerical rank {fit.rank}, relative residual against the retained labels "
            f"{fit.residual:.2g}."
        )
        cert = CertificateFields(
            guarantee=Guarantee.exact,
            epsilon=0.0,
            delta=0.0,
            sigma=0.0,
            sensitivity=0.0,
            accountant="none (exact: the projection is the retrained minimum-norm model)",
            sentence=sentence,
            constants={
                "interpolation_residual": Constant(
                    fit.residual, "measured", "‖Φ_r θ_rᵀ − Y_r‖ / ‖Y_r‖ in float64"
                ),
                "rank": Constant(float(fit.rank), "measured", "numerical rank of Φ_r"),
                "parameters_per_output": Constant(
                    float(phi.shape[1]), "declared", "p: trained-layer inputs plus the bias"
                ),
                "rank_tolerance": Constant(o.rank_tolerance, "declared", "rank cut-off"),
            },
            compares="the released model vs. the minimum-norm least-squares model trained on "
            "the retained data alone (seed 001, Theorem 4.1)",
            resets_lineage=True,
        )
        state = self._state(net, fit.theta)
        return Release(
            next_state={**state, **self._extra(fit, retained.sample_ids, phi.device)},
            weights=state,
            certificate=cert,
            event=None,
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics=_metrics(fit, route, phi, time.perf_counter() - start),
        )

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The minimum-norm solve on the retained data alone (the exact retrain)."""
        return self.train(inputs.retained).state


def _downdated(
    state: ModelState, retained_ids: list[int], phi: torch.Tensor
) -> tuple[torch.Tensor | None, str]:
    """K_r⁻¹ in `retained_ids` order from the stored K⁻¹ (rows `phi`, in that order): the
    rows that left downdated out, appended rows (ids the stored inverse lacks, after the
    others) updated in; or None with the reason."""
    if GRAM not in state or ROWS not in state:
        return None, "fresh solve (no stored Gram inverse)"
    rows = [int(s) for s in state[ROWS].tolist()]
    position = {s: i for i, s in enumerate(rows)}
    known = [s for s in retained_ids if s in position]
    if retained_ids[: len(known)] != known:
        return None, "fresh solve (the stored Gram inverse covers other samples)"
    device = state[GRAM].device
    keep = torch.zeros(len(rows), dtype=torch.bool, device=device)
    keep[[position[s] for s in known]] = True
    inverse = mn.downdate(state[GRAM].double(), keep)
    kept = [s for s, k in zip(rows, keep.tolist(), strict=True) if k]
    order = {s: i for i, s in enumerate(kept)}
    index = torch.tensor([order[s] for s in known], dtype=torch.int64, device=device)
    removed = len(rows) - len(kept)
    inverse = inverse[index][:, index]
    route = f"Gram-inverse downdate of {removed} rows"
    added = len(retained_ids) - len(known)
    if added:
        grown = mn.extend(inverse, phi[: len(known)].to(inverse), phi[len(known) :].to(inverse))
        if grown is None:
            return None, "fresh solve (the appended rows depend on the others)"
        inverse, route = grown, f"{route} and rank-{added} update"
    return inverse, route


def _metrics(fit: mn.MinNormFit, route: str, phi: torch.Tensor, seconds: float) -> JsonObject:
    return {
        "unlearn_seconds": seconds,
        "route": route,
        "interpolation_residual": fit.residual,
        "rank": fit.rank,
        "parameters_per_output": phi.shape[1],
        "gram_inverse_bytes": 0 if fit.gram_inverse is None else fit.gram_inverse.nbytes,
    }
