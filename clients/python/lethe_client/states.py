"""Every state a row can be in, as StrEnums: the database stores their string values."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class ModelStatus(StrEnum):
    """A model's life: queued, training, then ready (or failed)."""

    queued = "queued"
    training = "training"
    ready = "ready"
    failed = "failed"


class TaskStatus(StrEnum):
    """One deletion request's work on one model."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


class RequestStatus(StrEnum):
    """A deletion request: queued, running on its models, then done (or failed)."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


class AuditStatus(StrEnum):
    """A privacy audit: queued, running its shadow experiment, then done (or
    failed)."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


class DatasetStatus(StrEnum):
    """A dataset: registering (its samples are committed in chunks; no model or deletion may
    use it yet), then ready; or failed (its rows and keys gone, the error kept)."""

    registering = "registering"
    ready = "ready"
    failed = "failed"


class SampleStatus(StrEnum):
    """A sample: active, erasing (a request holds it), erased (its data key destroyed); an
    appended row is pending until its append finishes (no model, split or request sees it)."""

    pending = "pending"
    active = "active"
    erasing = "erasing"
    erased = "erased"


class VersionKind(StrEnum):
    """How a model version was made."""

    trained = "trained"
    imported = "imported"
    unlearned = "unlearned"
    retrained = "retrained"
    learned = "learned"  # appended rows learned


class Stage(StrEnum):
    """Where a model's training stands (its `progress.stage`)."""

    queued = "queued"
    loading = "loading data"
    importing = "importing"
    training = "training"
    preparing = "preparing updates"  # the method's resident state, before ready
    ready = "ready"
    failed = "failed"
    withdrawn = "withdrawn"  # failed for good: `workers.commit.withdraw_model`


class Guarantee(StrEnum):
    """What a certificate promises (DESIGN §7): exact (ε = δ = 0), rigorous (no unverifiable
    constant), conditional (declared or estimated constants), none (a heuristic)."""

    exact = "exact"
    rigorous = "rigorous"
    conditional = "conditional"
    none = "none"


FINISHED_REQUEST = frozenset({RequestStatus.done, RequestStatus.failed})
FINISHED_TASK = frozenset({TaskStatus.done, TaskStatus.failed})


def append_settled(status: str, learning: Iterable[str]) -> bool:
    """An append's work is over: it failed, or its rows are in and every model's learning of
    them (the statuses of its `learning`) has ended, done or failed."""
    if status == DatasetStatus.failed:
        return True
    return status == DatasetStatus.ready and all(s in FINISHED_TASK for s in learning)


class DeliveryStatus(StrEnum):
    """A webhook delivery: waiting for its next attempt, delivered (a 2xx), or
    given up after the retry window."""

    pending = "pending"
    delivered = "delivered"
    failed = "failed"


class ExportStatus(StrEnum):
    """A version's copy in MLflow: claimed and being registered (or waiting to be
    retried), registered (weights uploaded, the model version made), purged (Lethe purged the
    version and its artifact was deleted from MLflow), or skipped (purged before it was ever
    exported: nothing of it reached MLflow)."""

    pending = "pending"
    registered = "registered"
    purged = "purged"
    skipped = "skipped"
