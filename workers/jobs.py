"""Job entry points (RQ or the inline worker): train_model and process_deletions.

Jobs own transactions: each step is a short unit of work; the compute in between holds none.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from app.blobstore import DatabaseBlobStore
from app.db.session import read_transaction, transaction
from app.db.tables import Dataset, DeletionTask, Model, ModelVersion, Sample
from app.metrics import DELETIONS_PROCESSED, JOB_DURATION
from app.settings import Settings, get_settings
from workers import pipeline
from workers.data import test_arrays, training_arrays
from workers.lease import WORKER_ID, LeaseLost, ModelLease
from workers.methods import fit
from workers.methods.base import RetainedData, Trained
from workers.nets import build_net
from workers.statistics import write_block
from workers.training import accuracy
from workers.updates import compute_update

log = logging.getLogger("lethe.jobs")


def _setup(settings: Settings) -> None:
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)


def _lease(settings: Settings, model_id: int) -> ModelLease:
    return ModelLease(
        settings.resolved_database_url,
        model_id,
        settings.lease_seconds,
        settings.heartbeat_seconds,
        "embedded" if settings.embedded else "rq",
    )


def train_model(model_id: int) -> str:
    """Train version 1 of a queued model (with its method's recording), reporting progress."""
    settings = get_settings()
    url = settings.resolved_database_url
    _setup(settings)
    started = time.perf_counter()
    with _lease(settings, model_id) as lease:
        if not lease.held:
            return "busy"
        with transaction(url) as session:
            model = session.get(Model, model_id)
            if model is None or model.status not in ("queued", "training"):
                return "nothing to do"
            model.status = "training"
            model.progress = {"stage": "loading data"}
            dataset = session.get(Dataset, model.dataset_id)
            spec = pipeline.model_spec(model, dataset)
            data = training_arrays(session, model_id, dataset)
            test = test_arrays(session, dataset)
        try:
            imported = spec.training.get("imported")
            trained = (
                _load_imported(url, spec, imported)
                if imported
                else fit(
                    spec,
                    RetainedData(data.sample_ids, data.X, data.y, data.subjects),
                    _progress_writer(url, model_id),
                )
            )
            metrics = {
                **trained.metrics,
                "n_train": len(data),
                "train_accuracy": accuracy(
                    spec.architecture, trained.state, data.X, data.y, spec.n_classes
                ),
                "test_accuracy": accuracy(
                    spec.architecture, trained.state, test.X, test.y, spec.n_classes
                ),
            }
            _commit_trained(url, model_id, trained, metrics)
        except LeaseLost:
            raise
        except Exception as exc:
            with transaction(url) as session:
                session.execute(
                    update(Model)
                    .where(Model.id == model_id, Model.lease_owner == WORKER_ID)
                    .values(
                        status="failed",
                        error=f"training failed: {exc}",
                        progress={"stage": "failed"},
                    )
                )
            raise
    JOB_DURATION.labels("train_model").observe(time.perf_counter() - started)
    return "trained"


def _load_imported(url: str, spec: Any, imported: dict[str, str]) -> Trained:
    """Weights trained elsewhere, loaded without pickle and checked against the spec."""
    with transaction(url) as session:
        data = DatabaseBlobStore(session).get(imported["blob"])
    tensors = {k: v.float().contiguous() for k, v in st_load(data).items()}
    net = build_net(spec.architecture, spec.n_features, spec.n_classes)
    net.load_state_dict(tensors, strict=True)
    if not all(torch.isfinite(v).all() for v in tensors.values()):
        raise ValueError("the imported weights contain NaN or infinite values")
    return Trained(
        state=tensors,
        statistics=None,
        record={},
        metrics={"imported": True, "imported_sha256": imported["sha256"]},
    )


def _progress_writer(url: str, model_id: int):  # noqa: ANN202
    """Record 'epoch k of E' at most twice a second (and at the last epoch)."""
    last = [0.0]

    def progress(epoch: int, epochs: int, loss: float) -> None:
        now = time.perf_counter()
        if epoch < epochs and now - last[0] < 0.5:
            return
        last[0] = now
        with transaction(url) as session:
            session.execute(
                update(Model)
                .where(Model.id == model_id)
                .values(
                    progress={
                        "stage": "training",
                        "epoch": epoch,
                        "epochs": epochs,
                        "loss": round(loss, 6),
                    }
                )
            )

    return progress


def _commit_trained(url: str, model_id: int, trained: Trained, metrics: dict[str, Any]) -> None:
    with transaction(url) as session:
        model = session.get(Model, model_id)
        if model.lease_owner != WORKER_ID:
            raise LeaseLost(f"model {model_id} lease lost during training")
        store = DatabaseBlobStore(session)
        weights = st_save(trained.state)
        wkey, wsha = store.put(weights, f"model-{model_id}/weights")
        skey, _ = store.put(weights, f"model-{model_id}/state")
        if trained.record:
            metrics = {**metrics, "record": trained.record}
        imported = model.training.get("imported")
        if imported:
            store.delete([imported["blob"]])
        version = ModelVersion(
            model_id=model_id,
            number=1,
            parent_id=None,
            kind="imported" if imported else "trained",
            weights_key=wkey,
            weights_sha256=wsha,
            weights_size=len(weights),
            state_key=skey,
            metrics=metrics,
            n_train=metrics["n_train"],
        )
        session.add(version)
        if trained.statistics is not None:
            write_block(session, model_id, trained.statistics, replace=True)
        session.flush()
        model.current_version_id, model.status, model.error = version.id, "ready", None
        model.progress = {
            "stage": "ready",
            "epoch": model.training["epochs"],
            "epochs": model.training["epochs"],
        }


def process_deletions(model_id: int) -> str:
    """Apply every queued deletion task of the model, coalesced, one update per batch."""
    settings = get_settings()
    _setup(settings)
    applied = 0
    while True:
        with _lease(settings, model_id) as lease:
            if not lease.held:
                return f"busy (applied {applied})"
            while batch := _claim(settings, model_id, lease):
                _run_batch(settings, model_id, batch)
                applied += len(batch)
        # Re-check after releasing: a request committed while we held the lease may have had
        # its signal dropped by a worker that saw the model busy.
        if not _has_queued(settings, model_id):
            return f"applied {applied}"


def _claim(settings: Settings, model_id: int, lease: ModelLease) -> list[pipeline.ClaimedTask]:
    with transaction(settings.resolved_database_url) as session:
        if session.get(Model, model_id).status != "ready":
            return []
        return pipeline.claim_tasks(
            session, model_id, settings.max_batch_requests, lease.deadline()
        )


def _has_queued(settings: Settings, model_id: int) -> bool:
    with transaction(settings.resolved_database_url) as session:
        return (
            session.scalar(
                select(DeletionTask.id)
                .where(DeletionTask.model_id == model_id, DeletionTask.status == "queued")
                .limit(1)
            )
            is not None
        )


def _run_batch(settings: Settings, model_id: int, tasks: list[pipeline.ClaimedTask]) -> None:
    url = settings.resolved_database_url
    started = time.perf_counter()
    try:
        with read_transaction(url) as session:  # no write lock while computing
            batch = pipeline.load_batch(session, model_id, tasks)
            external = dict(
                session.execute(
                    select(Sample.id, Sample.external_id).where(
                        Sample.id.in_(batch.removed or [-1])
                    )
                ).all()
            )
            update_, metrics = compute_update(session, batch)
        _commit_with_retry(url, batch, update_, metrics, external)
    except Exception as exc:
        with transaction(url) as session:
            final = pipeline.fail_tasks(
                session,
                [t.task_id for t in tasks],
                f"{type(exc).__name__}: {exc}",
                settings.job_retries + 1,
            )
        log.exception("deletion batch for model %s failed (final=%s)", model_id, final)
        if final:
            _no_more_retries()
        raise
    DELETIONS_PROCESSED.labels(batch.method_name).inc(len(tasks))
    JOB_DURATION.labels("process_deletions").observe(time.perf_counter() - started)


def _no_more_retries() -> None:
    """The requests failed for good: stop RQ retrying, so the job lands in its failed registry."""
    from rq import get_current_job

    job = get_current_job()
    if job is not None:
        job.retries_left = 0


def _commit_with_retry(
    url: str,
    batch: pipeline.Batch,
    update_: Any,
    metrics: dict[str, Any],
    external: dict[int, str],
    attempts: int = 5,
) -> None:
    for attempt in range(attempts):
        try:
            with transaction(url) as session:
                pipeline.commit_update(session, batch, update_, metrics, external)
            return
        except (IntegrityError, OperationalError):  # chain head moved or lock timeout: retry
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * 2**attempt)
