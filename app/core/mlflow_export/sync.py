"""The MLflow syncer: one daemon thread in each API process copies every published
version to MLflow and deletes a purged one's artifact there. Lethe's tables are the truth and
`mlflow_exports` records what reached MLflow, so nothing is written in the commit that
publishes or purges a version: a pass finds live versions with no row and copied versions
that Lethe has purged since. Each is claimed (a row, or its `next_attempt_at` moved a lease
ahead) so that another API process leaves it, worked with no transaction open, and its outcome
committed after (not waiting for the disk: a record lost in a crash only repeats the work); a
failure is retried with back-off for as long as it takes (a purge must reach every copy). A
crash between MLflow's change and Lethe's commit repeats the work, which is idempotent
(`MlflowRegistry.register` finds the version by its tag; deleting is repeatable). A version
Lethe purges before its copy is made is never copied (its weights would only be deleted)."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from prometheus_client import Counter, Histogram
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.core.db.session import Database, rowcount
from app.core.db.tables import Certificate, MlflowExport, Model, ModelVersion, utcnow
from app.core.mlflow_export.registry import MlflowRegistry, Registered, VersionCopy
from app.core.settings import Settings
from app.core.states import ExportStatus
from app.core.storage.blobs import Blobs

log = logging.getLogger("lethe.mlflow")
BATCH = 10  # versions looked at per pass
LEASE = timedelta(minutes=5)  # one registration's upper bound (the upload included)
MAX_BACKOFF = timedelta(minutes=10)
EXPORTS = Counter("lethe_mlflow_exports_total", "MLflow copies and purges by outcome", ["outcome"])
SECONDS = Histogram(
    "lethe_mlflow_export_seconds",
    "One version's registration in MLflow (upload, model version, alias)",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


def due(db: Database, now: datetime) -> tuple[list[int], list[int]]:
    """(versions to register, versions to purge in MLflow), at most BATCH of each: live
    versions with no row or a due pending one, and copied versions Lethe purged since (or
    pending ones it purged before they were copied)."""
    live = ModelVersion.erased_at.is_(None) & ModelVersion.weights_key.is_not(None)
    waiting = (MlflowExport.status == ExportStatus.pending) & (MlflowExport.next_attempt_at <= now)
    with db.read() as session:
        register = session.scalars(
            select(ModelVersion.id)
            .outerjoin(MlflowExport, MlflowExport.version_id == ModelVersion.id)
            .where(live, MlflowExport.version_id.is_(None) | waiting)
            .order_by(ModelVersion.id)
            .limit(BATCH)
        ).all()
        purge = session.scalars(
            select(MlflowExport.version_id)
            .join(ModelVersion, ModelVersion.id == MlflowExport.version_id)
            .where(
                ModelVersion.erased_at.is_not(None),
                MlflowExport.next_attempt_at <= now,
                MlflowExport.status.in_([ExportStatus.registered, ExportStatus.pending]),
            )
            .order_by(MlflowExport.version_id)
            .limit(BATCH)
        ).all()
    return list(register), list(purge)


def claim(db: Database, version_id: int, now: datetime) -> bool:
    """Take `version_id` for one attempt: make its row, or move a due row's next attempt a
    lease ahead; False when another syncer holds it."""
    with db.write(durable=False) as session:
        row = session.get(MlflowExport, version_id)
        if row is None:
            model_id = session.scalar(
                select(ModelVersion.model_id).where(ModelVersion.id == version_id)
            )
            if model_id is None:
                return False
            session.add(
                MlflowExport(version_id=version_id, model_id=model_id, next_attempt_at=now + LEASE)
            )
            try:
                session.flush()
            except IntegrityError:  # another API process made it first
                return False
            return True
        moved = session.execute(
            update(MlflowExport)
            .where(
                MlflowExport.version_id == version_id,
                MlflowExport.next_attempt_at <= now,
                MlflowExport.status.in_([ExportStatus.pending, ExportStatus.registered]),
            )
            .values(next_attempt_at=now + LEASE)
            .execution_options(synchronize_session=False)
        )
        return rowcount(moved) == 1


def version_copy(db: Database, blobs: Blobs, version_id: int) -> VersionCopy | None:
    """The version's weights and tags (None when it was purged meanwhile): its model, number,
    parent, kind, SHA-256, and what its certificates state (guarantee, ε, δ, rows removed or
    added). Never a sample's or a subject's id."""
    with db.read() as session:
        version = session.get(ModelVersion, version_id)
        if version is None or version.erased_at is not None or version.weights_key is None:
            return None
        model = session.get(Model, version.model_id)
        assert model is not None
        parent = session.get(ModelVersion, version.parent_id) if version.parent_id else None
        certificates = session.scalars(
            select(Certificate)
            .where(Certificate.model_id == model.id, Certificate.to_version == version.number)
            .order_by(Certificate.id)
        ).all()
        handle = blobs.open(session, version.weights_key)
        weights = bytes(handle.read()) if handle is not None else None
        current = model.current_version_id == version.id
        tags = version_tags(model, version, parent, list(certificates))
    if weights is None:
        return None
    return VersionCopy(version.id, model.id, model.name, version.number, weights, tags, current)


def version_tags(
    model: Model,
    version: ModelVersion,
    parent: ModelVersion | None,
    certificates: list[Certificate],
) -> dict[str, str]:
    """MLflow tags (strings) for one version: Lethe's ids, the weights' SHA-256, the parent
    version, and from its certificates the guarantee, the largest ε and δ, their ids and the
    rows the version removed or added."""
    added = sum(int(json.loads(c.body).get("n_added", 0)) for c in certificates)
    tags = {
        "lethe.model_id": str(model.id),
        "lethe.model_name": model.name,
        "lethe.version": str(version.number),
        "lethe.version_id": str(version.id),
        "lethe.kind": str(version.kind),
        "lethe.weights_sha256": version.weights_sha256,
        "lethe.weights_url": f"/v1/models/{model.id}/versions/{version.number}/weights",
        "lethe.parent_version": str(parent.number) if parent is not None else "",
        "lethe.certificate_ids": ",".join(str(c.id) for c in certificates),
        "lethe.rows_removed": str(sum(c.n_removed for c in certificates)),
        "lethe.rows_added": str(added),
    }
    if certificates:
        tags["lethe.guarantee"] = ",".join(sorted({c.guarantee for c in certificates}))
        epsilons = [c.epsilon for c in certificates if c.epsilon is not None]
        deltas = [c.delta for c in certificates if c.delta is not None]
        tags["lethe.epsilon"] = repr(max(epsilons)) if epsilons else "none"
        tags["lethe.delta"] = repr(max(deltas)) if deltas else "none"
    else:
        tags["lethe.guarantee"] = "trained" if version.number == 1 else "none"
    return tags


def register_one(db: Database, blobs: Blobs, registry: MlflowRegistry, version_id: int) -> str:
    """Copy one claimed version to MLflow and record where it went; its outcome."""
    started = time.perf_counter()
    copy = version_copy(db, blobs, version_id)
    if copy is None:  # purged meanwhile: the purge pass looks for a copy made before
        return _outcome(db, version_id, None, None)
    where = registry.register(copy)
    seconds = time.perf_counter() - started
    SECONDS.observe(seconds)
    with db.write(durable=False) as session:
        session.execute(
            update(MlflowExport)
            .where(MlflowExport.version_id == version_id)
            .values(
                status=ExportStatus.registered,
                registered_model=where.registered_model,
                mlflow_version=where.mlflow_version,
                run_id=where.run_id,
                artifact_uri=where.artifact_uri,
                seconds=seconds,
                registered_at=utcnow(),
                next_attempt_at=utcnow(),  # the lease ends: a purge may take it at once
                last_error=None,
            )
        )
    return "registered"


def purge_one(db: Database, registry: MlflowRegistry, version_id: int) -> str:
    """Delete a purged version's artifact from MLflow (found by its row, or by its tag when a
    crash came between MLflow's change and Lethe's commit); its outcome."""
    with db.read() as session:
        row = session.get(MlflowExport, version_id)
        version = session.get(ModelVersion, version_id)
        assert row is not None and version is not None
        where = (
            Registered(row.registered_model, row.mlflow_version, row.run_id, row.artifact_uri)
            if row.status == ExportStatus.registered
            and row.registered_model and row.mlflow_version and row.run_id and row.artifact_uri
            else None
        )  # fmt: skip
        model_id, erased_at = version.model_id, version.erased_at
    if where is None:
        where = registry.find(model_id, version_id)
    if where is not None:
        registry.purge(where, (erased_at or utcnow()).isoformat())
    return _outcome(db, version_id, where, erased_at)


def _outcome(
    db: Database, version_id: int, where: Registered | None, erased_at: datetime | None
) -> str:
    """Record a purge: `purged` when a copy was found and its artifact deleted, `skipped` when
    the version never reached MLflow."""
    status = ExportStatus.purged if where is not None else ExportStatus.skipped
    with db.write(durable=False) as session:
        session.execute(
            update(MlflowExport)
            .where(MlflowExport.version_id == version_id)
            .values(status=status, purged_at=utcnow(), last_error=None)
        )
    return str(status)


def failed(db: Database, version_id: int, exc: Exception) -> None:
    """Count a failed attempt and set the next one after a back-off with jitter."""
    with db.write(durable=False) as session:
        row = session.get(MlflowExport, version_id)
        if row is None:
            return
        row.attempts += 1
        seconds = min(2.0 * 2 ** min(row.attempts - 1, 20), MAX_BACKOFF.total_seconds())
        row.next_attempt_at = utcnow() + timedelta(seconds=seconds * (0.5 + random.random() / 2))
        row.last_error = f"{type(exc).__name__}: {exc}"[:2000]


def sync_due(db: Database, blobs: Blobs, registry: MlflowRegistry) -> int:
    """One pass: register what is new, then delete what was purged (a new version's alias
    moves before its parent's artifact goes); how many were worked."""
    now = utcnow()
    register, purge = due(db, now)
    work: list[tuple[int, Callable[[], str]]] = []
    work += [(v, partial(register_one, db, blobs, registry, v)) for v in register]
    work += [(v, partial(purge_one, db, registry, v)) for v in purge]
    done = 0
    for version_id, job in work:
        if not claim(db, version_id, now):
            continue
        try:
            EXPORTS.labels(job()).inc()
        except Exception as exc:  # MLflow down or refusing: retried after a back-off
            log.warning("MLflow copy of version %s failed: %s", version_id, exc)
            EXPORTS.labels("failed").inc()
            failed(db, version_id, exc)
        done += 1
    return done


class Syncer:
    """Runs `sync_due` in one daemon thread until stopped: again at once while there was
    work, else every `mlflow_poll_seconds`. The MLflow client is made in the thread (importing
    it takes seconds; the API answers meanwhile)."""

    def __init__(self, db: Database, blobs: Blobs, settings: Settings) -> None:
        self.db, self.blobs, self.settings = db, blobs, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lethe-mlflow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        uri = self.settings.mlflow_tracking_uri
        assert uri is not None
        registry = MlflowRegistry(
            uri, self.settings.mlflow_experiment, self.settings.mlflow_model_prefix
        )
        while not self._stop.is_set():
            try:
                worked = sync_due(self.db, self.blobs, registry)
            except Exception:  # a database hiccup: the next pass tries again
                log.exception("MLflow sync pass failed")
                worked = 0
            if not worked:
                self._stop.wait(self.settings.mlflow_poll_seconds)
