"""Models learn appended rows, each method class against an independent
computation on the union: convex_head's Hessian update and Newton steps stay within their
certified shift of the exact optimum on the current rows (appends and removals interleaved);
SISA's learned ensemble is training from scratch with the same shards and slices, bit for
bit, only the shards the rows joined retrained; minnorm's rank-k update is the min-norm solve
on the union; any other method's learned version is the exact retrain on the union."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from app.core.states import Guarantee, VersionKind
from maths import convex
from methods.compute import PrivacyTarget, RemovedSamples, RetainedData, fit, joined, method_for
from methods.convex_head import removal
from methods.sharded_retrain import maths as sh
from tests.support.factories import model_spec, update_inputs
from workers.data import Arrays
from workers.resident import ModelSession
from workers.updates import decide

R, LAM, CLASSES = 6.0, 1e-2, 3


def data(n: int, p: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = (X[:, :CLASSES] + 0.8 * rng.normal(size=(n, CLASSES))).argmax(axis=1)
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y)


def nothing_removed(like: torch.Tensor) -> RemovedSamples:
    return RemovedSamples([], like[:0], torch.zeros(0, dtype=torch.long))


def rows(ids: list[int], X: torch.Tensor, y: torch.Tensor) -> RetainedData:
    return RetainedData(ids, X, y, [None] * len(ids), [f"id-{i}" for i in ids])


def test_an_update_with_rows_equals_the_quantities_recomputed_with_them() -> None:
    X, y = data(3000)
    problem = convex.Problem.of(X[:2500], y[:2500], CLASSES, R, LAM)
    theta = convex.solve(problem, 1e-12, 2000).theta
    blocks = lambda: ((problem.Z[i : i + 700], problem.T[i : i + 700]) for i in range(0, 2500, 700))  # noqa: E731
    resident = removal.anchored(blocks, problem.n, theta, R, LAM)
    extra = convex.Problem.of(X[2500:] * 3, y[2500:], CLASSES, R, LAM)  # larger rows: ρ grows
    after = removal.with_rows(resident, extra.Z, extra.T)
    union = convex.Problem(torch.cat([problem.Z, extra.Z]), torch.cat([problem.T, extra.T]), LAM)
    assert after.m == union.n == 3000
    truth = convex.gradient(union, theta)
    assert float(torch.linalg.norm(after.g - truth)) <= after.b + 1e-15
    u = union.T * (union.Z @ theta.T)
    w = torch.sigmoid(u) * torch.sigmoid(-u)
    eye = LAM * torch.eye(union.Z.shape[1], dtype=torch.float64)
    H = torch.stack(
        [(union.Z * w[:, a : a + 1]).T @ union.Z / union.n + eye for a in range(CLASSES)]
    )
    assert float(torch.linalg.matrix_norm(after.anchor.H - H, ord=2).max()) <= after.anchor.e_H
    S = union.Z.T @ union.Z / union.n
    assert float(torch.linalg.matrix_norm(after.anchor.S - S, ord=2)) <= after.anchor.e_S
    assert bool((after.anchor.column_abs >= union.Z.abs().sum(dim=0)).all())
    largest = float(torch.linalg.vector_norm(union.Z, dim=1).max())
    assert resident.anchor.rho < largest <= after.anchor.rho


@pytest.mark.parametrize("keep_rows", [True, False])
def test_appends_and_removals_through_convex_head_stay_within_the_certified_shift(
    keep_rows: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two appends and two removals, interleaved, through ConvexHead.unlearn with the resident
    state carried as the job carries it (the session grown, split, advanced): every release's
    noise-free state lies within its certified shift of the exact optimum on the rows the
    model then holds, and the certificate says what it compares with."""
    from methods.convex_head.compute import ConvexHead, to_theta

    if not keep_rows:
        monkeypatch.setattr(removal, "ROWS_BYTES", 0)
    X, y = data(4000)
    spec = model_spec(
        {"type": "logreg", "feature_norm": R},
        {"name": "convex_head", "lam": LAM, "R": R, "beta": 0.05},
        X.shape[1],
        CLASSES,
    )
    head = ConvexHead(spec)
    first = list(range(3000))
    arrays = Arrays(first, [str(i) for i in first], X[:3000], y[:3000], [None] * 3000)
    _, whole = ModelSession.of(0, 1, arrays, {}, arrays).split([], {}, [])
    session = ModelSession.of(0, 1, arrays, dict(head.train(whole).state), arrays)
    resident: object | None = None
    held = set(first)
    steps: list[tuple[str, list[int]]] = [
        ("add", list(range(3000, 3400))),
        ("remove", [3, 3100]),
        ("add", list(range(3400, 4000))),
        ("remove", list(range(50, 80))),
    ]
    empty = Arrays([], [], X[:0], y[:0], [])
    for version, (kind, ids) in enumerate(steps, start=2):
        added: RetainedData | None = None
        if kind == "add":
            added = rows(ids, X[ids], y[ids])
            removed, retained = session.split([], {}, [])
            retained = joined(retained, added)
        else:
            removed, retained = session.split(ids, {}, [])
        inputs = replace(
            update_inputs(spec, dict(session.state), removed, retained,
                          target=PrivacyTarget(1.0, 1e-5)),
            resident=resident,
            added=added,
        )  # fmt: skip
        release = head.unlearn(inputs)
        resident = release.resident
        assert isinstance(resident, removal.Resident)
        held = held | set(ids) if kind == "add" else held - set(ids)
        assert resident.m == len(held)
        assert (resident.rows is not None) is keep_rows
        kept = sorted(held)
        optimum = convex.solve(
            convex.Problem.of(X[kept], y[kept], CLASSES, R, LAM),
            1e-13,
            5000,
            start=to_theta(release.next_state),
        )
        theta = to_theta(release.next_state)
        shift = release.certificate.constants["s"].value
        assert (
            float(torch.linalg.norm(theta - optimum.theta)) <= shift + optimum.gradient_norm / LAM
        )
        assert shift <= 0.05
        if kind == "add":
            assert f"the {len(ids)} appended samples learned" in release.certificate.sentence
            grown = Arrays(ids, [f"id-{i}" for i in ids], X[ids], y[ids], [None] * len(ids))
            session = session.grown(grown, empty)
        session = session.advance(
            version, ids if kind == "remove" else [], dict(release.next_state), release.resident
        )


# ---- SISA ------------------------------------------------------------------------------------


N, P, K = 240, 6, 3
SHARDED = {"name": "sharded_retrain", "shards": 4, "slices": 3}
TRAINING = {"epochs": 4, "batch_size": 16, "learning_rate": 0.1, "momentum": 0.5, "seed": 7}


def clusters(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(K, P, generator=gen) * 2
    y = torch.arange(n) % K
    return centers[y] + torch.randn(n, P, generator=gen), y


def subjects(ids: list[int]) -> list[str | None]:
    return [f"person{i % 40}" if i % 2 else None for i in ids]


def test_sisa_learns_appended_rows_as_training_from_scratch_bit_for_bit() -> None:
    X, y = clusters(N + 30)
    spec = model_spec({"type": "mlp", "hidden": [8]}, SHARDED, P, K, TRAINING)
    ids = list(range(1000, 1000 + N + 30))
    first, extra = ids[:N], ids[N:]

    def data_of(chosen: list[int]) -> RetainedData:
        at = torch.tensor([ids.index(i) for i in chosen])
        return RetainedData(chosen, X[at], y[at], subjects(chosen), [f"e{i}" for i in chosen])

    trained = fit(spec, data_of(first))
    added = data_of(extra)
    inputs = replace(
        update_inputs(spec, trained.next_state, nothing_removed(X), joined(data_of(first), added)),
        added=added,
    )
    release = method_for("sharded_retrain", spec).unlearn(inputs)
    scratch = fit(spec, data_of(ids))
    assert release.weights.keys() == scratch.state.keys()
    assert all(torch.equal(release.weights[k], scratch.state[k]) for k in scratch.state)
    assert all(
        torch.equal(release.next_state[k], scratch.next_state[k]) for k in scratch.next_state
    )
    sharding = release.certificate.details["sharding"]
    assert sum(r["added"] for r in sharding["retrained"]) == 30
    assert release.certificate.guarantee == Guarantee.exact
    assert "30 appended samples" in release.certificate.sentence
    keys = sh.assignment_keys(added.X, added.y, added.subjects, added.external_ids)
    joined_shards = set(sh.Assignment.draw(extra, keys, 4, 3, 7).shard.tolist())
    assert {r["shard"] for r in sharding["retrained"]} == joined_shards


# ---- minnorm and the rest --------------------------------------------------------------------


def test_minnorm_learns_by_a_rank_k_update_equal_to_the_min_norm_solve() -> None:
    X, y = data(60, p=200, seed=3)
    spec = model_spec({"type": "logreg"}, {"name": "minnorm"}, 200, CLASSES)
    first, extra = list(range(50)), list(range(50, 60))
    trained = fit(spec, rows(first, X[:50], y[:50]))
    added = rows(extra, X[50:], y[50:])
    union = joined(rows(first, X[:50], y[:50]), added)
    inputs = replace(
        update_inputs(spec, trained.next_state, nothing_removed(X), union), added=added
    )
    release = method_for("minnorm", spec).unlearn(inputs)
    assert "rank-10 update" in str(release.metrics["route"])
    scratch = fit(spec, rows(list(range(60)), X, y))
    for k in scratch.state:
        assert torch.allclose(release.weights[k].double(), scratch.state[k].double(), atol=1e-9)


@pytest.mark.parametrize(
    "method",
    [
        {"name": "newton"},
        {"name": "output_perturbation"},
        {"name": "noisy_finetune", "T": 5},
        {"name": "retrain"},
    ],
)
def test_a_method_that_does_not_learn_releases_the_exact_retrain_on_the_union(method) -> None:
    X, y = data(300, p=5, seed=1)
    spec = model_spec({"type": "logreg"}, method, 5, CLASSES, {"epochs": 3, "seed": 2})
    trained = fit(spec, rows(list(range(250)), X[:250], y[:250]))
    added = rows(list(range(250, 300)), X[250:], y[250:])
    union = joined(rows(list(range(250)), X[:250], y[:250]), added)
    inputs = replace(
        update_inputs(spec, trained.next_state, nothing_removed(X), union), added=added
    )
    decision = decide(inputs)
    release = decision.release
    assert release.version_kind == VersionKind.learned
    assert decision.method == "retrain" and release.certificate.guarantee == Guarantee.exact
    assert release.certificate.resets_lineage and release.event is None
    scratch = fit(spec, rows(list(range(300)), X, y))
    assert all(torch.equal(release.weights[k], scratch.state[k]) for k in scratch.state)


def test_joined_rows_are_taken_in_the_order_asked() -> None:
    X, y = data(10, p=3)
    first, second = rows(list(range(6)), X[:6], y[:6]), rows(list(range(6, 10)), X[6:], y[6:])
    both = joined(first, second)
    at = torch.tensor([7, 2, 9, 2, 0])
    taken_X, taken_y = both.take(at)
    assert torch.equal(taken_X, X[at]) and torch.equal(taken_y, y[at])
    assert torch.equal(both.ids(), torch.arange(10))
    head_X, _ = both.head(8)
    assert torch.equal(head_X, X[:8])
    assert torch.equal(torch.cat([b for b, _ in both.blocks(4)]), X)
