"""Stronger canaries and a noise σ measured on the rows: high-leverage
canaries for linear models, the white-box weights score, the AUC's permutation null when the
release depends on the bits through their count, and recollection's σ calibrated on a
reference trained without canaries."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.core.specs import PrivacyPolicy
from app.privacy.audit_bounds import auc_p_value, joint_bound
from methods.compute import RemovedSamples, RetainedData, UpdateInputs, fit
from methods.recollection.compute import Recollection
from methods.recollection.replay import Replay
from tests.support.factories import digits_split, model_spec, update_inputs
from workers.privacy_audit import AuditOptions, high_leverage, run

ALPHA = 0.05

# newton with constants declared false on purpose (as bench/audit.py's overclaims): almost no
# unlearning step and almost no noise, certified ε = 1 all the same
FALSE_NEWTON = {
    "name": "newton", "L": 0.0, "M": 0.0, "C": 1000.0, "depth": 1, "H_sc": 1e9,
    "lam_min": 3e4, "max_relative_noise": 10.0,
}  # fmt: skip
LOGREG_TRAINING = {"epochs": 30, "momentum": 0.9, "learning_rate": 0.1, "seed": 0}


def gaussian_split(n: int = 1000, p: int = 1000, k: int = 5) -> tuple[RetainedData, RetainedData]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, k, n + 400)
    X = (rng.standard_normal((k, p)) * 0.15)[y] + rng.standard_normal((n + 400, p))
    X_t = torch.tensor(X, dtype=torch.float32)
    return (
        RetainedData(list(range(1, n + 1)), X_t[:n], torch.tensor(y[:n])),
        RetainedData(list(range(n + 1, n + 401)), X_t[n:], torch.tensor(y[n:])),
    )


def test_high_leverage_canaries_lie_where_the_data_do_not_vary() -> None:
    retained, _ = gaussian_split()
    X, y = high_leverage(retained, 400, 5, np.random.default_rng(1))  # 1,000 features
    data = retained.X.double()
    mean = data.mean(0)
    _, vectors = torch.linalg.eigh(torch.cov((data - mean).T))
    top = vectors[:, -250:]  # the data's 250 most varied directions
    canary_share = float(((X.double() - mean) @ top).norm() ** 2 / (X.double() - mean).norm() ** 2)
    data_share = float(((data - mean) @ top).norm() ** 2 / (data - mean).norm() ** 2)
    assert canary_share < 0.01 < data_share  # none of the canaries' offset is where data vary
    typical = float((data - mean).norm(dim=1).median())
    assert float((X.double() - mean).norm(dim=1).max()) == pytest.approx(typical, rel=1e-5)
    assert set(y.tolist()) <= set(range(5)) and len(set(y.tolist())) == 5


def test_leverage_canaries_and_the_weights_score_catch_a_false_certificate() -> None:
    """The weakest row of the issue's table (its data: 1,000 × 1,000, five classes; AUC 0.69
    with random canaries): leverage canaries see more of what the false newton certificate
    left behind; both scores prove it false."""
    retained, test = gaussian_split()
    spec = model_spec({"type": "logreg"}, FALSE_NEWTON, 1000, 5, training=LOGREG_TRAINING)
    found = {
        (kind, score): run(
            spec, PrivacyPolicy(), retained, test,
            AuditOptions(canaries=1000, kind=kind, score=score), seed=4,
        )
        for kind, score in (("random", "loss"), ("leverage", "loss"), ("leverage", "weights"))
    }  # fmt: skip
    for (kind, score), audit in found.items():
        assert audit.certified_epsilon == pytest.approx(1.0), (kind, score)
        assert audit.verdict == "violated", (kind, score, audit.bounds.joint)
    assert found["leverage", "loss"].bounds.auc > found["random", "loss"].bounds.auc
    joint = {key: audit.bounds.joint for key, audit in found.items()}
    assert all(j is not None for j in joint.values())
    assert joint["leverage", "loss"].epsilon > joint["random", "loss"].epsilon  # type: ignore[union-attr]


def test_the_weights_score_of_an_exact_retrain_is_its_reference() -> None:
    """An exact retrain releases the reference itself: every canary's weights score is 0, the
    AUC ½ and nothing is proved, whatever the bits."""
    retained, test = gaussian_split()
    spec = model_spec({"type": "logreg"}, {"name": "retrain"}, 1000, 5, training=LOGREG_TRAINING)
    audit = run(
        spec, PrivacyPolicy(), retained, test,
        AuditOptions(canaries=300, kind="leverage", score="weights"), seed=5,
    )  # fmt: skip
    assert audit.bounds.auc == 0.5 and audit.verdict in ("consistent", "inconclusive")
    assert audit.bounds.joint is not None and audit.bounds.joint.epsilon == 0.0
    assert audit.control is not None and audit.control.joint is not None
    assert audit.control.joint.epsilon > 1.0  # the shadow before the removal shows its canaries


def test_the_auc_null_holds_when_the_release_depends_on_the_count_of_bits() -> None:
    """A σ calibrated for removing Σb canaries makes the release depend on the bits' count:
    the permutation null keeps that count, so at ε = 0 the joint bound is above 0 in at most
    α of 300 runs."""
    rng = np.random.default_rng(11)
    m, runs, above, small = 400, 300, 0, 0
    for _ in range(runs):
        bits = rng.random(m) < 0.5
        sigma = 1.0 + 4.0 * bits.sum() / m  # the noise scale a function of the count alone
        scores = sigma * rng.standard_normal(m) + 0.1 * sigma
        small += auc_p_value(scores, bits, rng, 199) <= ALPHA
        above += joint_bound(scores, bits, 0.0, 1 - ALPHA, rng, permutations=199).epsilon > 0
    slack = 3 * math.sqrt(runs * ALPHA)
    assert small <= ALPHA * runs + slack and above <= ALPHA * runs + slack


def _recollection_inputs(n_removed: int) -> tuple[UpdateInputs, RetainedData]:
    retained, test = digits_split(400)
    spec = model_spec(
        {"type": "mlp", "hidden": [16]}, {"name": "recollection", "max_relative_noise": 1e30},
        64, 10, training={"epochs": 2, "seed": 0},
    )  # fmt: skip
    trained = fit(spec, retained)
    gone = retained.sample_ids[:n_removed]
    kept = RetainedData(
        retained.sample_ids[n_removed:], retained.X[n_removed:], retained.y[n_removed:]
    )
    stats = trained.statistics
    assert stats is not None
    vectors = {s: stats.vectors[i] for i, s in enumerate(stats.sample_ids)}
    removed = RemovedSamples(
        gone, retained.X[:n_removed], retained.y[:n_removed], {s: vectors[s] for s in gone}
    )
    inputs = update_inputs(spec, dict(trained.next_state), removed, kept, test=test)
    return replace(inputs, record=trained.record), kept


def test_recollection_calibrates_sigma_on_the_record_it_is_given() -> None:
    """σ comes from `noise_record` when an audit gives one (its reference trained without the
    canaries), from the model's own record otherwise; the update it releases draws that σ."""
    inputs, kept = _recollection_inputs(5)
    method = Recollection(inputs.spec)
    reference = fit(inputs.spec, kept)
    own, calibrated = (
        method.calibrated_sigma(inputs),
        method.calibrated_sigma(replace(inputs, noise_record=reference.record)),
    )
    assert own is not None and calibrated is not None and own != calibrated
    expected = Replay.of(reference.record).worst_case(5)
    plan = method.plan(replace(inputs, noise_record=reference.record), Replay.of(inputs.record))
    assert plan.sensitivity == expected and plan.sigma == calibrated
    released = method.unlearn(replace(inputs, noise_record=reference.record))
    assert released.metrics["sigma"] == calibrated


def test_an_audit_of_recollection_says_where_its_sigma_came_from() -> None:
    retained, test = digits_split(400)
    spec = model_spec(
        {"type": "mlp", "hidden": [16]}, {"name": "recollection", "max_relative_noise": 1e30},
        64, 10, training={"epochs": 2, "seed": 0},
    )  # fmt: skip
    audit = run(spec, PrivacyPolicy(), retained, test, AuditOptions(canaries=100), seed=6)
    assert audit.method == "recollection" and audit.noise is not None
    assert "without canaries" in str(audit.noise["calibrated_on"])
    sigma, shadow = audit.noise["sigma"], audit.noise["sigma_on_the_shadow"]
    assert isinstance(sigma, float) and isinstance(shadow, float) and sigma != shadow
    assert "reference" in audit.seconds
    assert audit.document()["noise"] == audit.noise
