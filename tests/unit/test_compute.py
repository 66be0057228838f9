"""`compute(inputs)` on in-memory inputs, no database: every method's decision, release and
certificate, and the pipeline's fallbacks (target infeasible, lineage budget)."""

from __future__ import annotations

import math

import pytest
import torch

from app.core.specs import PrivacyPolicy, TrainingConfig, architecture_of
from app.core.states import Guarantee, VersionKind
from app.privacy.lineage import GaussianRelease, SlopeRelease, gaussian_event
from maths.norms import global_norm
from methods import method_of
from methods.compute import (
    ModelSpec,
    RetainedData,
    UpdateInputs,
    fit,
)
from tests.support.factories import model_spec, split_off, update_inputs
from workers.certify import CertificateContext, certificate_fields
from workers.updates import compute
from workers.values import Fallback, Released

N, P, K = 150, 8, 3
TRAINING = TrainingConfig(epochs=3, batch_size=32, learning_rate=0.1, weight_decay=1e-3, seed=0)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(K, P, generator=gen) * 2
    y = torch.arange(N) % K
    return centers[y] + torch.randn(N, P, generator=gen), y


def inputs_for(
    method: dict,
    history: list | None = None,
    policy: PrivacyPolicy | None = None,
    architecture: dict | None = None,
) -> UpdateInputs:
    """Train the model as its method requires, then remove the first three samples."""
    X, y = data()
    ids = list(range(100, 100 + N))
    spec = model_spec(architecture or {"type": "logreg"}, method, P, K, TRAINING)
    everything = RetainedData(ids, X, y, [None] * N)
    trained = fit(spec, everything)
    removed, retained = split_off(everything, ids[:3], trained)
    return update_inputs(
        spec,
        trained.next_state,  # what the pipeline loads: the state and any method state
        removed,
        retained,
        policy=policy,
        test=RetainedData(ids[:30], X[:30], y[:30]),
        history=history,
        record=trained.record or None,
    )


def finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values())


def test_retrain_is_exact_and_resets_the_lineage() -> None:
    outcome = compute(inputs_for({"name": "retrain"}))
    decision = outcome.decision
    assert isinstance(decision, Released) and decision.admission is None
    release = decision.release
    assert release.certificate.guarantee == Guarantee.exact and release.certificate.epsilon == 0
    assert release.event is None and release.certificate.resets_lineage
    assert release.version_kind == VersionKind.retrained
    assert outcome.metrics["n_train"] == N - 3 and outcome.metrics["n_removed"] == 3


def test_output_perturbation_releases_a_gaussian_within_the_ball() -> None:
    inputs = inputs_for({"name": "output_perturbation", "C0": 0.5})
    decision = compute(inputs).decision
    assert isinstance(decision, Released) and decision.admission is not None
    release = decision.release
    cert = release.certificate
    assert cert.guarantee == Guarantee.rigorous and cert.sensitivity == 1.0
    assert global_norm(release.next_state.values()) <= 0.5 + 1e-6
    assert isinstance(release.event, GaussianRelease)
    assert release.event.z == pytest.approx(cert.sigma / cert.sensitivity)
    assert release.weights["1.weight"].ne(release.next_state["1.weight"]).any()  # noise drawn
    assert decision.admission.after.releases == 1


def test_noisy_finetune_gradient_clipping_is_a_slope_release() -> None:
    inputs = inputs_for({"name": "noisy_finetune", "T": 5, "batch_size": 16})
    decision = compute(inputs).decision
    assert isinstance(decision, Released)
    assert isinstance(decision.release.event, SlopeRelease)
    assert decision.release.certificate.epsilon <= inputs.target.epsilon + 1e-9
    assert decision.release.metrics["noisy_steps"] == 5
    assert finite(decision.release.weights)


def test_recollection_adds_the_vectors_and_certifies_conditionally() -> None:
    inputs = inputs_for({"name": "recollection", "max_relative_noise": None, "rho_checks": 2})
    decision = compute(inputs).decision
    assert isinstance(decision, Released)
    release = decision.release
    assert release.certificate.guarantee == Guarantee.conditional
    assert release.certificate.constants["rho"].source == "measured"
    assert sorted(release.statistics_to_delete) == inputs.removed.sample_ids
    assert finite(release.weights)


@pytest.mark.parametrize(
    "method",
    [
        {"name": "recollection", "max_relative_noise": None, "rho_checks": 2},
        {"name": "newton", "max_relative_noise": None, "depth": 50, "chains": 2},
    ],
)
def test_sigma_does_not_depend_on_which_rows_left(method: dict) -> None:
    """the same count removed from the same model, other rows: the same σ and Δ
    (public), whatever the rows' own bound or gradient."""
    first = inputs_for(method)
    X, y = data()
    ids = list(range(100, 100 + N))
    everything = RetainedData(ids, X, y, [None] * N)
    spec = first.spec
    trained = fit(spec, everything)
    removed, retained = split_off(everything, ids[-3:], trained)
    second = update_inputs(
        spec,
        trained.next_state,
        removed,
        retained,
        test=RetainedData(ids[:30], X[:30], y[:30]),
        record=trained.record or None,
    )
    certificates = []
    for inputs in (first, second):
        decision = compute(inputs).decision
        assert isinstance(decision, Released), decision
        certificates.append(decision.release.certificate)
    assert certificates[0].sigma == certificates[1].sigma
    assert certificates[0].sensitivity == certificates[1].sensitivity


def test_recollection_noise_guard_falls_back_to_an_exact_retrain() -> None:
    inputs = inputs_for({"name": "recollection", "max_relative_noise": 1e-9, "rho_checks": 2})
    decision = compute(inputs).decision
    assert isinstance(decision, Fallback) and decision.requested == "recollection"
    assert "max_relative_noise" in decision.reason
    assert decision.release.certificate.guarantee == Guarantee.exact
    assert decision.release.replace_statistics is not None  # the retrain re-recorded vectors


def test_newton_step_certifies_with_measured_constants() -> None:
    method = {"name": "newton", "max_relative_noise": None, "depth": 50, "chains": 2}
    decision = compute(inputs_for(method)).decision
    assert isinstance(decision, Released)
    constants = decision.release.certificate.constants
    assert constants["G"].source == "measured" and constants["L"].source == "declared"
    assert math.isfinite(decision.release.certificate.sigma)


def test_a_release_past_the_lineage_budget_retrains_exactly() -> None:
    spent = [gaussian_event(1.0, 1.0, 1.0, 1e-5)] * 50  # a lineage already far past ε = 10
    decision = compute(inputs_for({"name": "output_perturbation"}, history=spent)).decision
    assert isinstance(decision, Fallback)
    assert "past its budget" in decision.reason
    assert decision.release.certificate.guarantee == Guarantee.exact


def test_certificate_of_a_fallback_says_why() -> None:
    spent = [gaussian_event(1.0, 1.0, 1.0, 1e-5)] * 50
    inputs = inputs_for({"name": "output_perturbation"}, history=spent)
    decision = compute(inputs).decision
    ctx = CertificateContext(1, 1, 1, 2, "0" * 64, 3, 3, [1], "c" * 64)
    fields = certificate_fields(decision, inputs.policy, inputs.target, ctx)
    assert fields["method"] == "retrain" and fields["guarantee"] == "exact"
    assert fields["fallback_reason"] == decision.reason
    assert "Exact retraining was used because" in fields["sentence"]
    assert fields["cumulative_epsilon"] == 0.0 and fields["lineage_event"] is None


def test_convex_head_releases_on_a_measured_shift_and_hides_the_retrain_over_budget() -> None:
    X, y = data()
    ids = list(range(100, 100 + N))

    def decision(beta: float) -> Released | Fallback:
        method = method_of({"name": "convex_head", "lam": 1e-2, "R": 10.0, "beta": beta})
        arch = architecture_of({"type": "logreg", "feature_norm": 10.0})
        spec = ModelSpec(arch, TRAINING, method, P, K)
        trained = fit(spec, RetainedData(ids, X, y))
        assert trained.metrics["gradient_norm"] <= 1e-10
        removed, retained = split_off(RetainedData(ids, X, y), ids[:3])
        test = RetainedData(ids[:30], X[:30], y[:30])
        return compute(update_inputs(spec, trained.state, removed, retained, test=test)).decision

    released = decision(beta=1.0)
    assert isinstance(released, Released) and released.method == "convex_head"
    cert = released.release.certificate
    assert cert.guarantee == Guarantee.rigorous and cert.sensitivity == 1.0
    assert cert.constants["s"].source == "measured" and cert.constants["s"].value <= 1.0
    assert cert.epsilon == pytest.approx(1.0, rel=1e-3)
    assert isinstance(released.release.event, GaussianRelease)
    over = decision(beta=1e-15)  # the exact retrain, released through the same mechanism
    assert isinstance(over, Released) and over.hides_branch
    assert over.branch is not None and "exceeds the budget" in over.branch
    assert over.release.certificate.guarantee == Guarantee.rigorous
    assert isinstance(over.release.event, GaussianRelease)


@pytest.mark.parametrize("feature_norm", [None, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_logreg_release_is_scored_as_its_module_scores_it(
    feature_norm: float | None, dtype: torch.dtype
) -> None:
    """The accuracies score a logistic regression with its layer's functional forward, no
    module built per update: the same logits as the module loaded with the release (float64
    releases, convex_head's, included), bit for bit, or with clipped rows (scaled after the
    product, not copied) within float32 rounding and the same predicted class."""
    from maths.nets import build_net, parameters_of
    from maths.training import scorer

    spec = {"type": "logreg", "feature_norm": feature_norm}
    torch.manual_seed(0)
    release = {k: v.to(dtype) * 3 for k, v in build_net(spec, 6, 3).state_dict().items()}
    X = torch.randn(50, 2, 3) * 2
    net = build_net(spec, 6, 3)
    net.load_state_dict(parameters_of(net, release))
    with torch.no_grad():
        want = net(X)
    got = scorer(spec, release, 6, 3, torch.device("cpu"))(X)
    if feature_norm is None:
        assert torch.equal(got, want)
    else:
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(1), want.argmax(1))
        assert (X.flatten(1).norm(dim=1) > 2.0).any()  # some rows were clipped
