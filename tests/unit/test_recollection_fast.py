"""The closed-form curvature of the recollection precompute (methods/recollection/curvature.py)
against the generic torch.func HVPs it replaces: per operator on random inputs, and end to
end through a small train_recollection (same seed, so the same trajectory)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import grad, jvp, vmap

from maths.nets import ClipFeatures, FlatModel, build_net
from methods.recollection.curvature import (
    ClipJacobian,
    FuncCurvature,
    LogRegCurvature,
    MLPCurvature,
    batch_loss_of,
    curvature_for,
)
from methods.recollection.maths import _permute_rows_, train_recollection

LAM = 1e-2


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def problem(n: int = 40, f: int = 7, c: int = 4, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, f, generator=gen)
    y = torch.randint(0, c, (n,), generator=gen)
    return X, y


def torch_func_hvp(
    model: FlatModel, w: torch.Tensor, Xb: torch.Tensor, yb: torch.Tensor, size: int
) -> vmap:
    grad_fn = grad(batch_loss_of(model, Xb, yb, size, LAM))
    return vmap(lambda v: jvp(grad_fn, (w,), (v,))[1])


def logreg_net(bias: bool, feature_norm: float | None, f: int, c: int) -> nn.Module:
    torch.manual_seed(1)
    first = nn.Flatten() if feature_norm is None else ClipFeatures(feature_norm)
    return nn.Sequential(first, nn.Linear(f, c, bias=bias))


@pytest.mark.parametrize(
    "bias,feature_norm", [(True, None), (False, None), (True, 1.5)], ids=["bias", "no-bias", "R"]
)
def test_logreg_closed_form_equals_torch_func(bias: bool, feature_norm: float | None) -> None:
    X, y = problem()
    net = logreg_net(bias, feature_norm, 7, 4)
    model = FlatModel(net)
    w = model.flat() + 0.3 * torch.randn(
        model.flat().shape, generator=torch.Generator().manual_seed(2)
    )
    curv = LogRegCurvature(net, X, y, LAM, chunk=5)  # several chunks, one partial
    rows = torch.tensor([3, 9, 10, 17, 22, 31])  # members of a batch of 8: two excluded
    step = curv.at(w, rows, size=8)
    V = torch.randn(13, curv.d, generator=torch.Generator().manual_seed(3))
    expected = torch_func_hvp(model, w, X[rows], y[rows], 8)(V)
    got = curv.to_flat(step.hvp(curv.to_internal(V)))
    assert rel(got, expected) < 1e-5
    assert rel(got, V * LAM) > 0.1  # the data term is there, not only the weight decay

    def ce(wv: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model.logits(wv, x[None]), t[None])

    per_sample = vmap(grad(ce), in_dims=(None, 0, 0))(w, X[rows], y[rows])
    assert rel(curv.to_flat(step.sample_grads()), per_sample) < 1e-5
    assert torch.equal(curv.to_flat(curv.to_internal(V)), V)


def test_an_empty_batch_is_weight_decay_only() -> None:
    X, y = problem()
    net = logreg_net(True, None, 7, 4)
    curv = LogRegCurvature(net, X, y, LAM, chunk=4)
    step = curv.at(FlatModel(net).flat(), torch.tensor([], dtype=torch.long), size=8)
    V = torch.randn(6, curv.d)
    assert torch.allclose(step.hvp(V), LAM * V)
    A = V.clone()
    step.descend_(A, 0.5, ClipJacobian(torch.ones(curv.d), 1e6))
    assert torch.allclose(A, V * (1 - 0.5 * LAM))


@pytest.mark.parametrize("C", [1e6, 0.1], ids=["unclipped", "clipped"])
def test_fused_descent_is_the_hvp_update(C: float) -> None:
    X, y = problem()
    net = logreg_net(True, None, 7, 4)
    curv = LogRegCurvature(net, X, y, LAM, chunk=4)
    step = curv.at(FlatModel(net).flat(), torch.arange(10), size=10)
    g = torch.randn(curv.d, generator=torch.Generator().manual_seed(4))
    J = ClipJacobian(g, C)
    assert J.identity == (C > 1)
    V = torch.randn(11, curv.d, generator=torch.Generator().manual_seed(5))
    A = V.clone()
    step.descend_(A, 0.3, J)
    assert rel(A, V - 0.3 * J(step.hvp(V))) < 1e-6


@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu", "sigmoid"])
def test_mlp_r_operator_equals_torch_func(activation: str) -> None:
    X, y = problem(f=6, c=3)
    torch.manual_seed(0)
    net = build_net({"type": "mlp", "hidden": [5, 4], "activation": activation}, 6, 3)
    model = FlatModel(net)
    w = model.flat()
    curv = curvature_for({"type": "mlp", "hidden": [5, 4]}, model, X, y, LAM, chunk=4)
    assert isinstance(curv, MLPCurvature)
    rows = torch.tensor([0, 5, 6, 11, 30])
    step = curv.at(w, rows, size=7)
    V = torch.randn(9, curv.d, generator=torch.Generator().manual_seed(6))
    expected = torch_func_hvp(model, w, X[rows], y[rows], 7)(V)
    assert rel(step.hvp(V), expected) < 1e-5
    reference = FuncCurvature(model, X, y, LAM, chunk=4).at(w, rows, 7)
    assert rel(step.sample_grads(), reference.sample_grads()) < 1e-5


def test_architectures_pick_their_closed_form() -> None:
    X, y = problem(f=6, c=3)
    for arch, kind in [
        ({"type": "logreg"}, LogRegCurvature),
        ({"type": "logreg", "feature_norm": 2.0}, LogRegCurvature),
        ({"type": "mlp", "hidden": [4]}, MLPCurvature),
    ]:
        model = FlatModel(build_net(arch, 6, 3))
        assert isinstance(curvature_for(arch, model, X, y, LAM), kind)
        assert isinstance(curvature_for(arch, model, X, y, LAM, closed_form=False), FuncCurvature)


def test_rows_are_permuted_in_place() -> None:
    src = np.random.default_rng(0).permutation(50)
    src[:5] = np.arange(5)  # fixed points too
    src[5:] = np.random.default_rng(1).permutation(np.arange(5, 50))
    A = torch.randn(50, 3)
    expected = A[torch.from_numpy(src)]
    _permute_rows_(A, src)
    assert torch.equal(A, expected)


CONFIG = {"epochs": 2, "batch_size": 16, "learning_rate": 0.2, "weight_decay": 1e-3, "seed": 3}


@pytest.mark.parametrize(
    "arch,C",
    [
        ({"type": "logreg"}, 10.0),
        ({"type": "logreg"}, 0.3),  # clipped steps: J_t is not the identity
        ({"type": "mlp", "hidden": [8], "activation": "tanh"}, 0.3),
    ],
    ids=["logreg", "logreg-clipped", "mlp-clipped"],
)
def test_recorded_vectors_equal_the_generic_path(arch: dict, C: float) -> None:
    X, y = problem(n=50, f=6, c=3, seed=7)
    exclude = torch.zeros(50, dtype=torch.bool)
    exclude[[4, 20, 33]] = True
    kwargs = {"exclude": exclude, "rho_checks": 2, "power_iterations": 5}
    fast = train_recollection(arch, CONFIG, C, 0.99, X, y, 3, **kwargs)
    generic = train_recollection(arch, CONFIG, C, 0.99, X, y, 3, closed_form=False, **kwargs)
    assert fast.vectors is not None and generic.vectors is not None
    assert (fast.clipped_steps > 0) == (C < 1)
    assert all(torch.equal(fast.state[k], generic.state[k]) for k in fast.state)
    assert rel(fast.vectors, generic.vectors) < 1e-5
    assert float(fast.vectors[exclude].abs().max()) == 0.0  # never trained on, never visited
    assert float(fast.vectors[~exclude].norm(dim=1).min()) > 0.0
    assert abs(fast.rho - generic.rho) < 1e-4


@pytest.mark.parametrize("n, epochs, batch_size", [(1000, 3, 64), (1037, 2, 100), (5, 4, 8)])
def test_the_replay_gives_the_schedules_steps_and_bound(
    n: int, epochs: int, batch_size: int
) -> None:
    """The resident replay gives each sample the steps the batch schedule puts it
    in, and Theorem 2's bound as replaying the schedule sample by sample gives it."""
    from methods.recollection.maths import batch_schedule
    from methods.recollection.replay import Replay
    from methods.recollection.sensitivity import recollection_sensitivity_schedule

    rng = np.random.default_rng(n)
    order = (rng.permutation(n) * 7 + 3).tolist()  # ids in training order, not ascending
    record = {
        "train_sample_ids": order, "rho": 0.995, "rho_trace": [[0, 0.995]], "C": 2.0,
        "q": 0.999, "eta": 0.1, "epochs": epochs, "batch_size": batch_size, "seed": n,
        "weight_decay": 1e-3, "steps": 0, "clipped_steps": 0, "precompute_seconds": 0.0,
        "d": 3, "storage_dtype": "float32", "rows": n,
    }  # fmt: skip
    replay = Replay.of(record)
    schedule = batch_schedule(n, epochs, batch_size, n, 0.1, 0.999)
    position = {s: i for i, s in enumerate(order)}
    for k in (1, min(n, 7), n):
        removed = sorted(rng.choice(order, k, replace=False).tolist())
        expected = schedule.steps_of([position[s] for s in removed])
        assert replay.steps_of(removed).tolist() == expected
        by_sample = recollection_sensitivity_schedule(
            schedule.etas, 2.0, 0.995, expected, [len(b) for b in schedule.batches]
        )
        assert replay.sensitivity(removed) == pytest.approx(by_sample, rel=1e-12)
    assert replay.made_from(record) and not replay.made_from(dict(record))
    with pytest.raises(KeyError):
        replay.steps_of([order[0], 10 * n + 5])  # never trained on
