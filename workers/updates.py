"""Computing one coalesced update, with no database: the configured method's release if it
meets the target and fits the lineage budget, else an exact retrain (DESIGN §6–7).

`compute(inputs) -> Outcome` is pure apart from its random draws: the job loads `UpdateInputs`
in one short read, calls it with no transaction open, then commits the outcome.
`compute_on(inputs, device)` is the same on the worker's device (LETHE_DEVICE, workers/device.py);
`compute_storing` is what the job runs: that, with the release's blobs written meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

from app.core import shutdown
from app.core.jsontypes import JsonObject
from app.core.states import Guarantee, VersionKind
from app.privacy.lineage import LineageBudget, admit
from maths.evaluation import evaluate
from maths.nets import weights_norm
from maths.training import (
    Diverged,
    check_converged_on,
    check_finite,
    hits,
    is_classifier,
    scorer,
)
from methods import RETRAIN
from methods.compute import (
    PublicInfeasible,
    Release,
    TargetInfeasible,
    UnlearningMethod,
    UpdateInputs,
    method_for,
)
from methods.floor import FloorCheck
from workers.device import inputs_to, outcome_to_cpu, release_to_cpu
from workers.values import Decision, Fallback, Outcome, Released, Unrecoverable

log = logging.getLogger("lethe.updates")
T = TypeVar("T")

# The accuracies of a release are taken on the first ACCURACY_ROWS rows (by id) of the test
# split and of the retained set: fixed samples, so the metrics of an update do not grow with n
# (at a million rows the whole 200,000-row test split was half of a warm deletion).
ACCURACY_ROWS = 20_000
CONVERGENCE_BLOCK_ROWS = 65_536  # rows a block of the exact retrain's convergence check


def compute_on(inputs: UpdateInputs, device: torch.device) -> Outcome:
    """`compute` with the inputs moved to `device`; the release comes back on CPU, ready to be
    serialised and sealed."""
    return outcome_to_cpu(compute(inputs_to(inputs, device)))


def compute_storing(
    inputs: UpdateInputs,
    device: torch.device,
    store: Callable[[Release], T],
    discard: Callable[[T], None],
) -> tuple[Outcome, T]:
    """`compute_on`, with `store(release)` (the release on CPU) run in a thread while the
    release's metrics are measured: the blobs' sealing and writes and the accuracies' tensor
    work overlap, both mostly outside the interpreter lock (each a share of a warm
    deletion). What `store` returned is discarded if measuring fails."""
    moved = inputs_to(inputs, device)
    decision, seconds = _decided(moved)
    released = replace(decision, release=release_to_cpu(decision.release))
    storing = _STORING.submit(store, released.release)
    try:
        metrics = measure(moved, decision, seconds)
    except BaseException:
        with contextlib.suppress(Exception):  # the store's own failure is not the news here
            discard(storing.result())
        raise
    return Outcome(released, metrics), storing.result()


_STORING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lethe-store")


def compute(inputs: UpdateInputs) -> Outcome:
    """Decide, check and measure one update (the job commits it)."""
    decision, seconds = _decided(inputs)
    return Outcome(decision, measure(inputs, decision, seconds))


def _decided(inputs: UpdateInputs) -> tuple[Decision, float]:
    """`decide`, and the seconds it took (the update's own compute)."""
    start = time.perf_counter()
    decision = decide(inputs)
    return decision, time.perf_counter() - start


def measure(inputs: UpdateInputs, decision: Decision, seconds: float) -> JsonObject:
    """The metrics of a decided update: accuracies, sizes, what ran (and the evaluation the
    method's options ask for)."""
    release = decision.release
    metrics: JsonObject = {
        **release.metrics,
        **_accuracies(inputs, release),
        "unlearn_seconds": seconds,
        "n_train": len(inputs.retained),
        "n_test": len(inputs.test),  # not `.y`: a deferred split would be copied whole
        "n_removed": len(inputs.removed.y),
        **({"n_added": inputs.n_added} if inputs.n_added else {}),  # a learned version's
        "method": decision.method,
        # auditors only (app/core/services/models.PUBLIC_METRICS): the public fallback's reason is
        # in its certificate; a hidden branch's is a function of the removed rows
        "fallback_reason": decision.reason if isinstance(decision, Fallback) else decision.branch,
    }
    if release.event is None:  # noise-free and public: the next updates' utility scale
        metrics["noise_free_norm"] = weights_norm(release.weights)
    if inputs.method.options.evaluate and is_classifier(inputs.spec.architecture):
        metrics["evaluation"] = _evaluate(inputs, decision)
    return metrics


def decide(inputs: UpdateInputs) -> Decision:
    """`_decide`; an update that adds rows releases a `learned` version."""
    decision = _decide(inputs)
    if not inputs.n_added:
        return decision
    return replace(decision, release=replace(decision.release, version_kind=VersionKind.learned))


def _decide(inputs: UpdateInputs) -> Decision:
    """The configured method's release, or the exact retrain and the reason for it. A method
    that fails or releases non-finite weights falls back to the retrain too, so a deletion
    never fails for good because an update cannot be computed.

    Which branch ran must not tell which rows left: a failure whose reason depends
    on the removed rows (a measured bound over budget, a diverged step, an error) is, for a
    method that can (`hides_branch`), answered by the exact retrain released through the
    method's own mechanism, with the certificate its releases carry; the branch goes to
    auditors only. A reason that is a function of public values (`PublicInfeasible`, the
    lineage budget) leads to the public, noise-free exact retrain."""
    name = inputs.method.name
    if name == RETRAIN:
        return Released(exact_retrain(inputs), name, None)
    method = method_for(name, inputs.spec, inputs.shards)
    if inputs.n_added and not method.learns:  # public: rows were appended
        return Released(exact_retrain(inputs), RETRAIN, None)
    return _answer(method, inputs, _attempt(method, inputs))


def _answer(
    method: UnlearningMethod, inputs: UpdateInputs, attempt: Release | _Failure
) -> Decision:
    """The method's `attempt` if it may be released, else the exact retrain (through the
    method's mechanism where the reason depends on the removed rows)."""
    name = inputs.method.name
    hides = hides_branch(method)
    exact: Release | None = None
    branch: str | None = None
    if isinstance(attempt, _Failure):
        if attempt.public or not hides:
            return _fallback(inputs, attempt.reason)
        exact = exact_retrain(inputs)
        disguised = _through_mechanism(method, inputs, exact)
        if disguised is None:
            return Fallback(exact, name, attempt.reason)
        release, branch = disguised, attempt.reason
    else:
        release = attempt
    if method.spec.guarantee == Guarantee.exact or release.event is None:
        return Released(release, name, None, hides, branch)
    below = utility_floor(inputs, release)
    if below is not None:  # a function of public values: the plan's σ and public norms
        return _fallback(inputs, below, exact)
    budget = LineageBudget(inputs.policy.lineage_epsilon, inputs.policy.lineage_delta)
    admission = admit(budget, inputs.history, release.event)
    if not admission.admitted:  # a function of the public history and the planned event
        return _fallback(inputs, admission.reason, exact)
    return Released(release, name, admission, hides, branch)


def utility_floor(inputs: UpdateInputs, release: Release) -> str | None:
    """Why a noisy release would be noise rather than a model, where it would: its planned
    noise (σ of the method's data-free plan, over the d parameters it noises: σ·√d) exceeds
    the policy's `max_relative_noise` of the model's last noise-free version's norm. Every
    term is public (a method whose σ is measured on the rows has no data-free plan and its
    own guard), so the exact retrain it leads to reveals nothing of which rows left."""
    share, scale = inputs.policy.max_relative_noise, inputs.public_norm
    if share is None or not scale:
        return None
    plan = inputs.method.plan(inputs.target.epsilon, inputs.target.delta)
    if plan.feasible is None or plan.sigma <= 0:
        return None
    noised = sum(
        int(torch.count_nonzero(w != release.next_state[k]))
        for k, w in release.weights.items()
        if k in release.next_state and release.next_state[k].shape == w.shape
    )
    check = FloorCheck(
        plan.sigma, noised, share, scale, "the norm of the model's last noise-free version"
    )
    return check.reason() if check.below else None


def hides_branch(method: UnlearningMethod) -> bool:
    """Whether the method releases its data-dependent fallbacks through its own mechanism:
    a property of the method, never of the request."""
    return type(method).through_mechanism is not UnlearningMethod.through_mechanism


@dataclass(frozen=True)
class _Failure:
    """Why the method's own update cannot be released; `public`: a function of public values."""

    reason: str
    public: bool


def _attempt(method: UnlearningMethod, inputs: UpdateInputs) -> Release | _Failure:
    """The method's release, checked, or why it cannot be released."""
    name, target = inputs.method.name, inputs.target
    cannot = f"{name} cannot meet (ε={target.epsilon:g}, δ={target.delta:g})"
    try:
        release = method.unlearn(inputs)
        check_finite(release.weights)
        check_finite(release.next_state)
    except PublicInfeasible as exc:
        return _Failure(f"{cannot}: {exc}", True)
    except TargetInfeasible as exc:
        return _Failure(f"{cannot}: {exc}", False)
    except shutdown.Interrupted:
        raise  # not a failure of the method: the job stops and resumes on the next start
    except Exception as exc:  # noqa: BLE001 - any failure of the update: retrain exactly
        return _Failure(f"{name} could not compute the update: {_described(exc)}", False)
    heuristic = release.certificate.guarantee == Guarantee.none
    if method.spec.guarantee != Guarantee.exact and heuristic and not inputs.policy.allow_heuristic:
        return _Failure(
            "the method's guarantee is heuristic and the policy does not allow it", False
        )
    return release


def _through_mechanism(
    method: UnlearningMethod, inputs: UpdateInputs, exact: Release
) -> Release | None:
    """`exact` released through the method's mechanism, checked; None if that failed (the
    worker's log says why; the public retrain follows)."""
    try:
        release = method.through_mechanism(inputs, exact)
        if release is not None:
            check_finite(release.weights)
            check_finite(release.next_state)
        return release
    except shutdown.Interrupted:
        raise
    except Exception:  # noqa: BLE001 - the public exact retrain is still a correct answer
        log.warning("releasing the exact retrain through the mechanism failed", exc_info=True)
        return None


def exact_retrain(inputs: UpdateInputs) -> Release:
    """The exact retrain on the retained data, checked: Unrecoverable when it diverges."""
    release = method_for(RETRAIN, inputs.spec, inputs.shards).unlearn(inputs)
    spec, retained = inputs.spec, inputs.retained
    try:
        check_converged_on(  # a block at a time: the retained rows are not copied whole
            spec.architecture,
            release.weights,
            retained.blocks(CONVERGENCE_BLOCK_ROWS),
            spec.n_classes,
            spec.aggregation,
        )
        check_finite(release.next_state)
    except Diverged as exc:
        raise Unrecoverable(f"the exact retrain diverged: {exc}") from exc
    if release.resident is not None:  # the next request makes no Hessian pass
        log.info("model %s: %s (made by the retrain)", inputs.model_id, RESIDENT_READY)
    return release


def _described(exc: Exception) -> str:
    """What the certificate may say of a failure: a non-finite check names only layers; any
    other error only its type (its message could carry values of the removed data). The
    worker's log keeps the traceback."""
    if isinstance(exc, Diverged):
        return str(exc)
    log.warning("update failed; retraining exactly", exc_info=exc)
    return f"{type(exc).__name__} (see the worker's log)"


# what the worker logs once the resident state after an exact retrain is ready (bench/scale.py)
RESIDENT_READY = "resident state ready after an exact retrain"


def _fallback(inputs: UpdateInputs, reason: str, exact: Release | None = None) -> Fallback:
    """The public exact retrain (made now unless `exact` was)."""
    release = exact if exact is not None else exact_retrain(inputs)
    return Fallback(release, inputs.method.name, reason)


def _accuracies(inputs: UpdateInputs, release: Release) -> dict[str, float | int | None]:
    """Of a classifier's release (a topic model has none), on the first ACCURACY_ROWS rows
    by id of the test split and of the retained set: an update whose maths never reads the
    retained rows does not read them, or a test split that grows with n, for a metric."""
    arch, k, w = inputs.spec.architecture, inputs.spec.n_classes, release.weights
    # the released weights are public: their norm puts σ in context
    norm: dict[str, float | int | None] = {"weights_norm": weights_norm(w)}
    if not is_classifier(arch):
        return norm
    X_kept, y_kept = inputs.retained.head(ACCURACY_ROWS)
    X_test, y_test = inputs.test.head(ACCURACY_ROWS)
    removed = inputs.removed
    features = math.prod(X_test.shape[1:])
    score = scorer(arch, w, features, k, X_test.device, inputs.spec.aggregation)

    def on(X: torch.Tensor, y: torch.Tensor) -> float | None:
        return hits(score(X), y.to(X_test.device)) if len(y) else None

    return {  # one module for the three sets
        **norm,
        "test_accuracy": on(X_test, y_test),
        "test_accuracy_rows": len(y_test),
        "retain_accuracy": on(X_kept, y_kept),
        "retain_accuracy_rows": len(y_kept),
        "forget_accuracy": on(removed.X, removed.y),
    }


def _evaluate(inputs: UpdateInputs, decision: Decision) -> JsonObject:
    """Compare the release with the method's reference (the coupled retrain for recollection,
    the release itself for an exact retrain, else seeded retraining on the retained data)."""
    start = time.perf_counter()
    release = decision.release
    reference = method_for(decision.method, inputs.spec).reference(inputs, release)
    result = evaluate(
        inputs.spec.architecture,
        inputs.spec.n_classes,
        release=release.weights,
        noise_free=release.next_state,
        original=inputs.state,
        reference=reference,
        forget=(inputs.removed.X, inputs.removed.y),
        retain=(inputs.retained.X, inputs.retained.y),
        test=(inputs.test.X, inputs.test.y),
        aggregation=inputs.spec.aggregation,
    )
    result["seconds"] = time.perf_counter() - start
    return result
