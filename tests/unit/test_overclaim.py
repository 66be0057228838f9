"""Issue 25 on in-memory inputs: certificates that never overclaim. minnorm's release is the
retrain when rows are dependent; a sharded ensemble is a function of the data, not of database
ids; a divergent model's deletion falls back and, failing that, withdraws the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.core.specs import TrainingConfig, architecture_of
from app.core.states import Guarantee
from maths.training import Diverged, check_converged
from methods import method_of
from methods.compute import (
    ModelSpec,
    RetainedData,
    UpdateInputs,
    fit,
)
from tests.support.factories import split_off, update_inputs
from workers.updates import compute
from workers.values import Released, Unrecoverable

TRAINING = TrainingConfig(epochs=3, batch_size=16, learning_rate=0.1, momentum=0.5, seed=7)


def inputs_for(
    spec: ModelSpec, state: dict[str, torch.Tensor], data: RetainedData, gone: list[int]
) -> UpdateInputs:
    removed, retained = split_off(data, gone)
    return update_inputs(spec, state, removed, retained)


# ---- 1. minnorm: exact means the retrain, also with dependent rows ----------------------------


def duplicated_data() -> RetainedData:
    """12 independent rows (p = 40 > n) and 5 duplicates of rows 0-4 with other labels."""
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(12, 40, generator=gen)
    y = torch.arange(12) % 4
    X = torch.cat([X, X[:5]])
    y = torch.cat([y, (y[:5] + 1) % 4])
    return RetainedData(list(range(100, 117)), X, y)


def min_norm_least_squares(X: torch.Tensor, y: torch.Tensor, classes: int) -> np.ndarray:
    """An independent solve: numpy's pinv of [X, 1] on one-hot labels, θ as C × (p + 1)."""
    phi = np.concatenate([X.double().numpy(), np.ones((len(X), 1))], axis=1)
    targets = np.eye(classes)[y.numpy()]
    return (np.linalg.pinv(phi, rcond=1e-10) @ targets).T


def theta(state: dict[str, torch.Tensor]) -> np.ndarray:
    w, b = state["1.weight"].double(), state["1.bias"].double()
    return torch.cat([w, b.unsqueeze(1)], dim=1).numpy()


@pytest.mark.parametrize("removed", [[112, 113, 114], [112, 113, 114, 115, 116], [100, 101]])
def test_minnorm_with_dependent_rows_releases_the_least_squares_retrain(removed: list[int]) -> None:
    data = duplicated_data()
    spec = ModelSpec(
        architecture_of({"type": "logreg"}),
        TRAINING,
        method_of({"name": "minnorm"}),
        40,
        4,
    )
    trained = fit(spec, data)
    inputs = inputs_for(spec, trained.next_state, data, removed)
    outcome = compute(inputs)
    cert = outcome.decision.release.certificate
    assert cert.guarantee == Guarantee.exact
    expected = min_norm_least_squares(inputs.retained.X, inputs.retained.y, 4)
    released = theta(outcome.decision.release.weights)
    scale = np.linalg.norm(expected)
    assert np.linalg.norm(released - expected) / scale < 1e-6, "exact must be the retrain"
    retrained = theta(fit(spec, inputs.retained).state)
    assert np.linalg.norm(released - retrained) / scale < 1e-6


# ---- 2. sharded_retrain: the ensemble is a function of the data ----------------------------


def sharded_spec() -> ModelSpec:
    method = method_of({"name": "sharded_retrain", "shards": 4, "slices": 2})
    return ModelSpec(architecture_of({"type": "mlp", "hidden": [8]}), TRAINING, method, 6, 3)


def registration(first_id: int, external_ids: list[str]) -> RetainedData:
    """The same subject-less data as a second upload would give it: other database ids."""
    gen = torch.Generator().manual_seed(5)
    y = torch.arange(160) % 3
    X = torch.randn(3, 6, generator=gen)[y] * 2 + torch.randn(160, 6, generator=gen)
    return RetainedData(list(range(first_id, first_id + 160)), X, y, [None] * 160, external_ids)


@pytest.mark.parametrize("with_ids", [True, False])
def test_two_registrations_of_subjectless_data_give_the_same_ensemble(with_ids: bool) -> None:
    ids = [f"row-{i}" for i in range(160)] if with_ids else []
    a, b = registration(1, ids), registration(5_001, ids)
    spec = sharded_spec()
    first, second = fit(spec, a), fit(spec, b)
    assert first.state.keys() == second.state.keys()
    assert all(torch.equal(first.state[k], second.state[k]) for k in first.state)
    assert first.metrics["sisa"]["shard_sizes"] == second.metrics["sisa"]["shard_sizes"]
    # and a deletion of the same rows leaves the same ensemble in both
    gone_a, gone_b = [a.sample_ids[7], a.sample_ids[90]], [b.sample_ids[7], b.sample_ids[90]]
    after_a = compute(inputs_for(spec, first.next_state, a, gone_a)).decision.release.weights
    after_b = compute(inputs_for(spec, second.next_state, b, gone_b)).decision.release.weights
    assert all(torch.equal(after_a[k], after_b[k]) for k in after_a)


# ---- 3. an update that cannot be computed falls back; a retrain that diverges is refused ----


def small_data() -> RetainedData:
    gen = torch.Generator().manual_seed(2)
    y = torch.arange(90) % 3
    X = torch.randn(3, 6, generator=gen)[y] * 2 + torch.randn(90, 6, generator=gen)
    return RetainedData(list(range(90)), X, y)


def test_a_method_whose_update_fails_releases_the_retrain_through_its_mechanism() -> None:
    """The failure depends on the data, so the exact retrain goes out through the method's
    own mechanism and certificate, the branch to auditors only."""
    data = small_data()
    spec = ModelSpec(
        architecture_of({"type": "mlp", "hidden": [8]}),
        TRAINING,
        method_of({"name": "output_perturbation", "C0": 10.0}),
        6,
        3,
    )
    trained = fit(spec, data)
    poisoned = {k: torch.full_like(v, float("nan")) for k, v in trained.next_state.items()}
    outcome = compute(inputs_for(spec, poisoned, data, [0, 1]))
    decision = outcome.decision
    assert isinstance(decision, Released) and decision.method == "output_perturbation"
    assert decision.branch is not None and "could not compute the update" in decision.branch
    assert decision.release.certificate.guarantee == Guarantee.rigorous
    assert decision.release.event is not None and decision.admission is not None
    assert all(torch.isfinite(v).all() for v in decision.release.weights.values())
    assert outcome.metrics["fallback_reason"] == decision.branch  # auditors' metrics


def test_a_retrain_that_diverges_is_unrecoverable() -> None:
    divergent = TrainingConfig(
        epochs=3, batch_size=16, learning_rate=8.58, weight_decay=0.41, momentum=0.9, seed=1
    )
    spec = ModelSpec(
        architecture_of({"type": "mlp", "hidden": [8]}), divergent, method_of({}), 6, 3
    )
    data = small_data()
    with pytest.raises(Diverged):
        check_converged(spec.architecture, fit(spec, data).state, data.X, data.y, 3)
    with pytest.raises(Unrecoverable, match="exact retrain diverged"):
        compute(inputs_for(spec, {}, data, [0]))
