"""Computing one coalesced update: the configured method, or an exact retrain when it cannot
meet the target or would exceed the lineage budget; plus its evaluation. Nothing here writes."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session

from app.privacy.lineage import compose_events, gaussian_event
from app.services.privacy import lineage_events
from workers import pipeline
from workers.data import Arrays, arrays_for, test_arrays, training_arrays
from workers.evaluation import evaluate
from workers.methods import method_for
from workers.methods.base import RemovedSamples, RetainedData, TargetInfeasible, Update
from workers.statistics import read_vectors
from workers.training import accuracy, train

log = logging.getLogger("lethe.updates")


def compute_update(session: Session, batch: pipeline.Batch) -> tuple[Update | None, dict]:
    if not batch.removed:
        return None, {}
    removed_set = set(batch.removed)
    everything = training_arrays(session, batch.model_id, batch.dataset)
    keep = torch.tensor([s not in removed_set for s in everything.sample_ids])
    retained = RetainedData(
        [s for s in everything.sample_ids if s not in removed_set],
        everything.X[keep],
        everything.y[keep],
        [s for s, k in zip(everything.subjects, keep.tolist(), strict=True) if k],
    )
    removed = RemovedSamples(
        [s for s in everything.sample_ids if s in removed_set],
        everything.X[~keep],
        everything.y[~keep],
        previously_removed=batch.previously_removed,
    )
    start = time.perf_counter()
    update_, reason = _try_method(session, batch, removed, retained)
    if reason is not None:
        log.warning(
            "model %s: exact retrain instead of %s: %s", batch.model_id, batch.method_name, reason
        )
        batch.method_name = "retrain"
        update_ = method_for("retrain", batch.spec).unlearn(
            batch.state, removed, batch.target(), retained
        )
        update_.certificate.fallback_reason = reason
    seconds = time.perf_counter() - start
    test = test_arrays(session, batch.dataset)
    arch, k = batch.spec.architecture, batch.spec.n_classes
    metrics = {
        **update_.metrics,
        "unlearn_seconds": seconds,
        "n_train": len(retained.y),
        "n_removed": len(removed.y),
        "method": batch.method_name,
        "fallback_reason": reason,
        "test_accuracy": accuracy(arch, update_.release, test.X, test.y, k),
        "retain_accuracy": accuracy(arch, update_.release, retained.X, retained.y, k),
        "forget_accuracy": accuracy(arch, update_.release, removed.X, removed.y, k),
    }
    if not all(np.isfinite(v.numpy()).all() for v in update_.release.values()):
        raise ValueError("the update produced non-finite weights; nothing is released")
    if batch.spec.method.get("evaluate"):
        metrics["evaluation"] = _evaluate(session, batch, update_, removed, retained, test)
    return update_, metrics


def _try_method(
    session: Session, batch: pipeline.Batch, removed: RemovedSamples, retained: RetainedData
) -> tuple[Update | None, str | None]:
    """The configured method's update and its lineage spend, or the reason to retrain."""
    method = method_for(batch.method_name, batch.spec)
    if method.guarantee == "exact":
        return method.unlearn(batch.state, removed, batch.target(), retained), None
    kind = getattr(method, "statistics_kind", None)
    if kind is not None:
        removed.statistics = read_vectors(session, batch.model_id, removed.sample_ids)
    try:
        update_ = method.unlearn(
            batch.state, removed, batch.target(), retained if method.needs_retained_data else None
        )
    except TargetInfeasible as exc:
        target = batch.target()
        return None, (
            f"{batch.method_name} cannot meet (ε={target.epsilon:g}, δ={target.delta:g}): {exc}"
        )
    cert = update_.certificate
    if cert.guarantee == "none" and not batch.policy.get("allow_heuristic"):
        return None, "the method's guarantee is heuristic and the policy does not allow it"
    if cert.guarantee != "exact" and cert.sigma > 0 and cert.sensitivity > 0:
        if cert.lineage_event is None:
            cert.lineage_event = gaussian_event(
                cert.sigma, cert.sensitivity, cert.epsilon, cert.delta
            )
        history = lineage_events(session, batch.model_id)
        spend = compose_events([*history, cert.lineage_event], batch.policy["lineage_delta"])
        if (
            spend.epsilon > batch.policy["lineage_epsilon"]
            or spend.delta > batch.policy["lineage_delta"]
        ):
            return None, (
                f"this release would bring the lineage to ε={spend.epsilon:.4g} "
                f"(δ={spend.delta:g}), past its budget "
                f"ε={batch.policy['lineage_epsilon']:g}, "
                f"δ={batch.policy['lineage_delta']:g}"
            )
        update_.lineage = spend
    return update_, None


def _evaluate(
    session: Session,
    batch: pipeline.Batch,
    update_: Update,
    removed: RemovedSamples,
    retained: RetainedData,
    test: Arrays,
) -> dict[str, Any]:
    """Compare the update with a retrained reference: the coupled retrain for recollection
    (same batch order, denominator kept), else seeded retraining on the retained data."""
    start = time.perf_counter()
    spec = batch.spec
    if batch.method_name == "recollection" and spec.record:
        from workers.methods.recollection import coupled_retrain

        order = spec.record["train_sample_ids"]
        gone = set(batch.previously_removed) | set(removed.sample_ids)
        full = arrays_for(session, batch.dataset, order)
        exclude = torch.tensor([s in gone for s in order])
        reference = coupled_retrain(spec, full.X, full.y, exclude)
    elif batch.method_name == "retrain":
        reference = update_.release
    else:
        reference = train(spec.architecture, spec.training, retained.X, retained.y, spec.n_classes)
    result = evaluate(
        spec.architecture,
        spec.n_classes,
        release=update_.release,
        noise_free=update_.next_state,
        original=batch.state,
        reference=reference,
        forget=(removed.X, removed.y),
        retain=(retained.X, retained.y),
        test=(test.X, test.y),
    )
    result["seconds"] = time.perf_counter() - start
    return result
