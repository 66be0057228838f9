"""The transactions of the deletion pipeline (DESIGN §6): claim, load, commit, fail.

Each function is one unit of work. `commit_update` writes the new version, one chained
certificate per request, the removals, the purge of older versions and the request states
together, or nothing at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.audit import append_certificate, removed_ids_digest
from app.blobstore import DatabaseBlobStore
from app.db.tables import (
    Certificate,
    Dataset,
    DeletionRequest,
    DeletionTask,
    Model,
    ModelSample,
    ModelVersion,
    SampleStatistic,
    utcnow,
)
from app.privacy import DP_ACCOUNTING_VERSION
from app.services.deletions import erase_payloads
from workers.lease import WORKER_ID, LeaseLost
from workers.methods.base import ModelSpec, ModelState, PrivacyTarget, Update
from workers.statistics import write_block


@dataclass
class ClaimedTask:
    task_id: int
    request_id: int
    sample_ids: list[int]
    method: str | None
    epsilon: float | None
    delta: float | None


@dataclass
class Batch:
    """What one coalesced update needs, loaded in one read transaction."""

    model_id: int
    spec: ModelSpec
    dataset: Dataset
    policy: dict[str, Any]
    method_name: str
    parent_id: int
    parent_number: int
    state: ModelState
    tasks: list[ClaimedTask]
    previously_removed: list[int] = field(default_factory=list)
    removed_by_task: dict[int, list[int]] = field(default_factory=dict)

    @property
    def removed(self) -> list[int]:
        return sorted({s for ids in self.removed_by_task.values() for s in ids})

    def target(self) -> PrivacyTarget:
        eps = min([self.policy["epsilon"], *[t.epsilon for t in self.tasks if t.epsilon]])
        dlt = min([self.policy["delta"], *[t.delta for t in self.tasks if t.delta]])
        return PrivacyTarget(epsilon=eps, delta=dlt)


def model_spec(
    model: Model,
    dataset: Dataset,
    record: dict[str, Any] | None = None,
) -> ModelSpec:
    return ModelSpec(
        architecture=model.architecture,
        training=model.training,
        method=model.method,
        n_features=int(np.prod(dataset.feature_shape)),
        n_classes=dataset.n_classes,
        record=record,
    )


def training_record(session: Session, model_id: int) -> tuple[dict[str, Any] | None, list[int]]:
    """The newest version's training record, and the samples removed since it was made."""
    versions = session.execute(
        select(ModelVersion.id, ModelVersion.number, ModelVersion.metrics)
        .where(ModelVersion.model_id == model_id)
        .order_by(ModelVersion.number.desc())
    ).all()
    for _, number, metrics in versions:
        if metrics and metrics.get("record"):
            later = [vid for vid, n, _ in versions if n > number]
            removed = session.scalars(
                select(ModelSample.sample_id).where(
                    ModelSample.model_id == model_id,
                    ModelSample.removed_version_id.in_(later or [-1]),
                )
            ).all()
            return metrics["record"], sorted(removed)
    return None, []


def claim_tasks(session: Session, model_id: int, limit: int, deadline: Any) -> list[ClaimedTask]:
    """Mark up to `limit` queued tasks of the model running under our lease (coalescing)."""
    rows = session.execute(
        select(DeletionTask, DeletionRequest)
        .join(DeletionRequest, DeletionRequest.id == DeletionTask.request_id)
        .where(DeletionTask.model_id == model_id, DeletionTask.status == "queued")
        .order_by(DeletionTask.id)
        .limit(limit)
    ).all()
    claimed = []
    for task, request in rows:
        task.status, task.lease_owner, task.lease_expires_at = "running", WORKER_ID, deadline
        task.attempts += 1
        if request.status == "queued":
            request.status = "running"
        claimed.append(
            ClaimedTask(
                task.id,
                request.id,
                list(request.sample_ids),
                request.method,
                request.epsilon,
                request.delta,
            )
        )
    return claimed


def load_batch(session: Session, model_id: int, tasks: list[ClaimedTask]) -> Batch:
    model = session.get(Model, model_id)
    dataset = session.get(Dataset, model.dataset_id)
    parent = session.get(ModelVersion, model.current_version_id)
    state_bytes = DatabaseBlobStore(session).get(parent.state_key)
    wanted = sorted({s for t in tasks for s in t.sample_ids})
    held: set[int] = set()
    for start in range(0, len(wanted), 5000):
        held.update(
            session.scalars(
                select(ModelSample.sample_id).where(
                    ModelSample.model_id == model_id,
                    ModelSample.removed_version_id.is_(None),
                    ModelSample.sample_id.in_(wanted[start : start + 5000]),
                )
            )
        )
    requested = {t.method for t in tasks if t.method}
    method_name = "retrain" if "retrain" in requested else model.method["name"]
    record, previously_removed = training_record(session, model_id)
    batch = Batch(
        model_id=model_id,
        spec=model_spec(model, dataset, record),
        previously_removed=previously_removed,
        dataset=dataset,
        policy=model.privacy,
        method_name=method_name,
        parent_id=parent.id,
        parent_number=parent.number,
        state=dict(st_load(state_bytes)),
        tasks=tasks,
    )
    claimed: set[int] = set()
    for t in tasks:  # a sample asked for twice is removed once, credited to the first request
        mine = [s for s in t.sample_ids if s in held and s not in claimed]
        claimed.update(mine)
        batch.removed_by_task[t.task_id] = mine
    return batch


def commit_update(
    session: Session,
    batch: Batch,
    update_: Update | None,
    metrics: dict[str, Any],
    external_ids: dict[int, str],
) -> int | None:
    """Apply the update atomically; returns the new version id (None if nothing to remove)."""
    model = session.get(Model, batch.model_id)
    if model.lease_owner != WORKER_ID:
        raise LeaseLost(f"model {batch.model_id} is now leased by {model.lease_owner}")
    if model.current_version_id != batch.parent_id:
        raise LeaseLost(f"model {batch.model_id} moved past version {batch.parent_number}")
    version = None
    if update_ is not None:
        version = _write_version(session, batch, update_, metrics)
    rows = {
        t.id: t
        for t in session.scalars(
            select(DeletionTask).where(DeletionTask.id.in_([t.task_id for t in batch.tasks]))
        )
    }
    removals: list[dict[str, int]] = []
    for task in batch.tasks:
        removed = batch.removed_by_task[task.task_id]
        row = rows[task.task_id]
        if row.status != "running" or row.lease_owner != WORKER_ID:
            raise LeaseLost(f"task {task.task_id} was reclaimed")
        if removed and version is not None:
            cert = _certify(session, batch, task, update_, version, removed, external_ids)
            removals += [
                {
                    "model_id": batch.model_id,
                    "sample_id": s,
                    "removed_version_id": version.id,
                    "removed_certificate_id": cert.id,
                }
                for s in removed
            ]
            row.certificate_id, row.version_id = cert.id, version.id
        else:
            row.certificate_id = _earlier_certificate(session, batch.model_id, task.sample_ids)
        row.status, row.n_removed, row.lease_owner, row.lease_expires_at = (
            "done",
            len(removed),
            None,
            None,
        )
    if removals:  # bulk UPDATE by primary key; these samples were held (checked under lease)
        session.execute(update(ModelSample), removals)
    if version is not None:
        if update_.replace_statistics is not None:  # a retrain re-recorded everything
            write_block(session, batch.model_id, update_.replace_statistics, replace=True)
        else:
            session.execute(
                delete(SampleStatistic).where(
                    SampleStatistic.model_id == batch.model_id,
                    SampleStatistic.sample_id.in_(update_.statistics_to_delete or [-1]),
                )
            )
        _purge_older_versions(session, batch.model_id, version.id)
        model.current_version_id = version.id
    session.flush()
    finish_requests(session, {t.request_id for t in batch.tasks})
    return version.id if version is not None else None


def _write_version(
    session: Session, batch: Batch, update_: Update, metrics: dict[str, Any]
) -> ModelVersion:
    store = DatabaseBlobStore(session)
    weights = st_save(update_.release)
    wkey, wsha = store.put(weights, f"model-{batch.model_id}/weights")
    skey, _ = store.put(st_save(update_.next_state), f"model-{batch.model_id}/state")
    version = ModelVersion(
        model_id=batch.model_id,
        number=batch.parent_number + 1,
        parent_id=batch.parent_id,
        kind=update_.version_kind,
        weights_key=wkey,
        weights_sha256=wsha,
        weights_size=len(weights),
        state_key=skey,
        metrics={**metrics, **({"record": update_.record} if update_.record else {})},
        n_train=int(metrics.get("n_train", 0)),
    )
    session.add(version)
    session.flush()
    return version


def _certify(
    session: Session,
    batch: Batch,
    task: ClaimedTask,
    update_: Update,
    version: ModelVersion,
    removed: list[int],
    external_ids: dict[int, str],
) -> Certificate:
    c = update_.certificate
    spend = update_.lineage
    cum_eps, cum_delta = (spend.epsilon, spend.delta) if spend and spend.releases else (0.0, 0.0)
    salt, digest = removed_ids_digest([external_ids[s] for s in removed])
    target = batch.target()
    sentence = c.sentence
    if spend and spend.releases:
        sentence += (
            f" Since its last exact retrain this model has made {spend.releases} "
            f"noisy release(s), together (ε={spend.epsilon:.4g}, δ={spend.delta:.3g}) "
            f"of its lineage budget ε={batch.policy['lineage_epsilon']:g}."
        )
    if c.fallback_reason:
        sentence += f" Exact retraining was used because {c.fallback_reason}."
    fields = {
        "request_id": task.request_id,
        "model_id": batch.model_id,
        "from_version": batch.parent_number,
        "to_version": version.number,
        "method": batch.method_name,
        "guarantee": c.guarantee,
        "epsilon": _finite(c.epsilon),
        "delta": _finite(c.delta),
        "sigma": _finite(c.sigma),
        "sensitivity": _finite(c.sensitivity),
        "accountant": c.accountant,
        "accountant_versions": {
            "dp-accounting": DP_ACCOUNTING_VERSION,
            "lineage": spend.accountant if spend else None,
        },
        "constants": {
            k: {"value": _finite(v.value), "source": v.source, "meaning": v.meaning}
            for k, v in c.constants.items()
        },
        "cumulative_epsilon": _finite(cum_eps),
        "cumulative_delta": _finite(cum_delta),
        "lineage": {
            "releases_since_reset": spend.releases if spend else 0,
            "budget_epsilon": batch.policy["lineage_epsilon"],
            "budget_delta": batch.policy["lineage_delta"],
        },
        "lineage_reset": c.resets_lineage,
        "lineage_event": c.lineage_event,
        "fallback_reason": c.fallback_reason,
        "target": {"epsilon": target.epsilon, "delta": target.delta},
        "n_removed": len(removed),
        "n_removed_in_update": len(batch.removed),
        "coalesced_requests": sorted({t.request_id for t in batch.tasks}),
        "removed_ids_salt": salt,
        "removed_ids_sha256": digest,
        "release_sha256": version.weights_sha256,
        "compares": c.compares,
        "sentence": sentence,
    }
    return append_certificate(session, fields)


def _finite(x: float) -> float:
    if not math.isfinite(float(x)):
        raise ValueError(f"refusing to certify a non-finite value {x!r}")
    return float(x)


def _earlier_certificate(session: Session, model_id: int, sample_ids: list[int]) -> int | None:
    """The certificate that already removed these samples from the model (applied once)."""
    if not sample_ids:
        return None
    return session.scalar(
        select(ModelSample.removed_certificate_id)
        .where(
            ModelSample.model_id == model_id,
            ModelSample.sample_id.in_(sample_ids[:5000]),
            ModelSample.removed_certificate_id.is_not(None),
        )
        .limit(1)
    )


def _purge_older_versions(session: Session, model_id: int, keep_id: int) -> None:
    """Every earlier version was trained with the removed samples: delete its bytes."""
    older = session.scalars(
        select(ModelVersion).where(
            ModelVersion.model_id == model_id,
            ModelVersion.id != keep_id,
            ModelVersion.erased_at.is_(None),
        )
    ).all()
    store = DatabaseBlobStore(session)
    for v in older:
        store.delete([k for k in (v.weights_key, v.state_key) if k])
        v.weights_key, v.state_key, v.erased_at = None, None, utcnow()


def finish_requests(session: Session, request_ids: set[int]) -> None:
    """A request is done when all its models are; only then are its payloads erased."""
    if not request_ids:
        return
    statuses: dict[int, set[str]] = {r: set() for r in request_ids}
    for request_id, status in session.execute(
        select(DeletionTask.request_id, DeletionTask.status).where(
            DeletionTask.request_id.in_(request_ids)
        )
    ):
        statuses[request_id].add(status)
    requests = session.scalars(
        select(DeletionRequest).where(DeletionRequest.id.in_(request_ids))
    ).all()
    done = [r for r in requests if statuses[r.id] <= {"done"}]
    erase_payloads(session, sorted({s for r in done for s in r.sample_ids}))
    now = utcnow()
    for request in requests:
        seen = statuses[request.id]
        if seen <= {"done"}:
            request.status, request.finished_at = "done", now
        elif "failed" in seen and not seen & {"queued", "running"}:
            request.status, request.finished_at = "failed", now


def fail_tasks(session: Session, task_ids: list[int], error: str, max_attempts: int) -> bool:
    """Put tasks back to queued, or fail them (and their requests) after `max_attempts`.

    Returns True when the tasks failed for good.
    """
    final = False
    requests: set[int] = set()
    for task in session.scalars(select(DeletionTask).where(DeletionTask.id.in_(task_ids))):
        if task.status != "running" or task.lease_owner != WORKER_ID:
            continue
        task.error = error[:2000]
        task.lease_owner = task.lease_expires_at = None
        if task.attempts >= max_attempts:
            task.status, final = "failed", True
            requests.add(task.request_id)
        else:
            task.status = "queued"
    for request_id in requests:
        request = session.get(DeletionRequest, request_id)
        request.error = error[:2000]
    finish_requests(session, requests)
    return final
