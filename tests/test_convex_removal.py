"""convex_head's removal without a pass over the retained rows (issue 28): the downdated
gradient, Hessian and second moment stay within their carried bounds, and the carried bound on
‖∇F‖ after each Newton step holds against an independent exact solve at 1, 10 and 100
removals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from maths import convex
from methods.convex_head import removal

R, LAM, CLASSES = 6.0, 1e-2, 3


def data(n: int = 3000, p: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = (X[:, :CLASSES] + 0.8 * rng.normal(size=(n, CLASSES))).argmax(axis=1)
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y)


def blocks_of(problem: convex.Problem, size: int = 700) -> removal.Blocks:
    return lambda: (
        (problem.Z[i : i + size], problem.T[i : i + size]) for i in range(0, problem.n, size)
    )


def start() -> tuple[convex.Problem, removal.Resident]:
    X, y = data()
    problem = convex.Problem.of(X, y, CLASSES, R, LAM)
    theta = convex.solve(problem, 1e-12, 2000).theta
    return problem, removal.anchored(blocks_of(problem), problem.n, theta, R, LAM)


def exact_hessians(problem: convex.Problem, theta: torch.Tensor) -> torch.Tensor:
    u = problem.T * (problem.Z @ theta.T)
    w = torch.sigmoid(u) * torch.sigmoid(-u)
    eye = LAM * torch.eye(problem.Z.shape[1], dtype=torch.float64)
    return torch.stack(
        [(problem.Z * w[:, a : a + 1]).T @ problem.Z / problem.n + eye for a in range(CLASSES)]
    )


def test_the_anchor_is_the_measured_gradient_and_the_exact_hessian() -> None:
    problem, resident = start()
    assert torch.allclose(resident.g, convex.gradient(problem, resident.theta), rtol=0, atol=1e-15)
    # a looser, cheaper form of the rounding bound, never below it
    assert convex.rounding_bound(problem, resident.theta) <= resident.b < 1e-9
    H = exact_hessians(problem, resident.theta)
    assert (
        float(torch.linalg.matrix_norm(resident.anchor.H - H, ord=2).max()) <= resident.anchor.e_H
    )
    assert 0 < resident.anchor.e_H < 1e-10


def test_a_downdate_equals_the_quantities_recomputed_without_the_rows() -> None:
    problem, resident = start()
    out = torch.arange(0, 40)
    kept = torch.ones(problem.n, dtype=torch.bool)
    kept[out] = False
    smaller = convex.Problem(problem.Z[kept], problem.T[kept], LAM)
    after = removal.without(resident, problem.Z[out], problem.T[out])
    assert after.m == smaller.n
    truth = convex.gradient(smaller, resident.theta)  # same Θ, fewer rows
    assert float(torch.linalg.norm(after.g - truth)) <= after.b + 1e-15
    H = exact_hessians(smaller, resident.anchor.theta)
    mismatch = float(torch.linalg.matrix_norm(after.anchor.H - H, ord=2).max())
    assert mismatch <= after.anchor.e_H
    S = smaller.Z.T @ smaller.Z / smaller.n
    assert float(torch.linalg.matrix_norm(after.anchor.S - S, ord=2)) <= after.anchor.e_S
    column_abs = smaller.Z.abs().sum(dim=0)  # an upper bound, with no trace of the rows left
    assert bool((after.anchor.column_abs >= column_abs).all())
    assert bool((after.anchor.column_abs <= column_abs * (1 + 1e-9)).all())
    with pytest.raises(ValueError, match="every retained row"):
        removal.without(resident, problem.Z, problem.T)


@pytest.mark.parametrize("batch", [1, 10, 100])
def test_the_carried_bound_holds_against_an_independent_solve(batch: int) -> None:
    """Ten requests of `batch` rows each, no pass over the retained rows after the anchor:
    after each, the exact optimum of what is left lies within bound/λ of the state."""
    problem, resident = start()
    kept = torch.ones(problem.n, dtype=torch.bool)
    order = torch.randperm(problem.n, generator=torch.Generator().manual_seed(batch))
    for request in range(10 if batch < 100 else 3):
        out = order[request * batch : (request + 1) * batch]
        kept[out] = False
        resident = removal.without(resident, problem.Z[out], problem.T[out])
        resident = removal.newton_step(resident)
        assert resident.last is not None and resident.last.remainder > 0
        for _ in range(2):
            resident = removal.newton_step(resident)
        retained = convex.Problem(problem.Z[kept], problem.T[kept], LAM)
        optimum = convex.solve(retained, 1e-13, 5000, start=resident.theta)
        distance = float(torch.linalg.norm(resident.theta - optimum.theta))
        true_gradient = float(torch.linalg.norm(convex.gradient(retained, resident.theta)))
        assert true_gradient <= resident.bound
        assert distance <= resident.bound / LAM + optimum.gradient_norm / LAM
        assert resident.bound / LAM < 1.0  # not vacuous: below a β a user would set


def test_a_stale_anchor_is_paid_for_by_its_drift_term() -> None:
    """Moving the state away from the anchor grows the drift part of the bound, and the
    bound still holds."""
    problem, resident = start()
    far = resident.theta + 0.05 * torch.randn_like(resident.theta, dtype=torch.float64)
    moved = removal.measured(
        removal.Resident(resident.m, far, resident.g, resident.b, resident.anchor, R, LAM),
        blocks_of(problem),
    )
    stepped = removal.newton_step(moved)
    assert stepped.last is not None and stepped.last.drift > 0
    true_gradient = float(torch.linalg.norm(convex.gradient(problem, stepped.theta)))
    assert true_gradient <= stepped.bound
