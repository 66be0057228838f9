"""Creating models (a training job) and reading their versions and released weights."""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import bindparam, func, insert, literal, select
from sqlalchemy.orm import Session

from app.core.architectures import check_weights
from app.core.db.session import Database
from app.core.db.tables import Dataset, MlflowExport, Model, ModelSample, ModelVersion, Sample
from app.core.errors import APIError, not_found, unprocessable
from app.core.jsontypes import JsonObject
from app.core.mlflow_export.views import export_view
from app.core.schemas import ModelCreate
from app.core.services import memory
from app.core.services.auto_method import choose
from app.core.services.datasets import ready_dataset
from app.core.specs import (
    ImportedWeights,
    StoredMethod,
    StoredTraining,
    TopicHeadSpec,
    TopicModelSpec,
)
from app.core.states import ModelStatus, SampleStatus, Stage, VersionKind
from app.core.storage.blobs import Blobs, OpenBlob, WrittenBlob
from app.core.wire import Progress
from architectures import kind_of
from methods import get_method, method_names, method_of
from methods.floor import at_creation


def create_model(session: Session, spec: ModelCreate, memory_limit: int | None = None) -> Model:
    """Record the model and snapshot its training set (active train samples); status queued.
    The method may refuse the model first (e.g. minnorm when n ≥ p), and so may the memory
    budget (`memory_limit` bytes, app/core/services/memory.py): nothing is written."""
    ds = ready_dataset(session, spec.dataset_id)
    active_train = (
        Sample.dataset_id == ds.id,
        Sample.split == "train",
        Sample.status == SampleStatus.active,
    )
    n_train = session.scalar(select(func.count()).where(*active_train)) or 0
    if not n_train:
        raise unprocessable("no_training_data", "the dataset has no active training samples")
    if isinstance(spec.architecture, TopicHeadSpec):
        spec = spec.model_copy(update={"architecture": _head_on_base(session, spec, ds)})
    chosen_by = None
    if spec.method.auto:
        spec, chosen_by = choose(spec, ds, n_train)
    _check_fits(spec, ds, n_train, memory_limit)
    model = Model(
        name=spec.name,
        dataset_id=ds.id,
        architecture=spec.architecture,
        training=StoredTraining.model_validate(spec.training.model_dump()),
        method=StoredMethod.model_validate({**spec.method.model_dump(), "chosen_by": chosen_by}),
        privacy=spec.privacy,
        status=ModelStatus.queued,
        progress=Progress(stage=Stage.queued),
        n_enrolled=n_train,
    )
    session.add(model)
    session.flush()
    members = select(literal(model.id), Sample.id).where(*active_train)
    session.execute(insert(ModelSample).from_select(["model_id", "sample_id"], members))
    return model


def _check_fits(spec: ModelCreate, ds: Dataset, n_train: int, memory_limit: int | None) -> None:
    """422 where the architecture needs another kind of dataset, the method refuses the
    model, or the memory budget would not hold it."""
    needs = kind_of(spec.architecture).dataset_kind
    if needs is not None and ds.kind != needs:
        raise unprocessable(
            "topic_model_needs_text",
            f"a {spec.architecture.type} learns from a {needs} dataset; dataset {ds.id} is "
            f"{ds.kind}",
        )
    method = method_of(spec.method.model_dump())
    features = math.prod(ds.feature_shape)
    method.check_model(spec.architecture, n_train, features)
    floor = at_creation(method, spec.architecture, features, ds.n_classes, spec.privacy)
    if floor is not None and floor.below:
        raise unprocessable(
            "below_utility_floor",
            f"every release of {method.name} under this policy would be noise: "
            f"{floor.reason()}, so each deletion would retrain exactly. Raise ε, change the "
            "method's options, or choose an exact method (or set max_relative_noise: null to "
            "release such noise)",
            floor.figures(),
        )
    if memory_limit is not None:
        needed = memory.estimate(
            spec.architecture, spec.training, method, n_train, features, ds.n_classes, ds.n_samples
        )
        memory.check(needed, memory_limit)


def _head_on_base(session: Session, spec: ModelCreate, ds: Dataset) -> TopicHeadSpec:
    """A topic head names a topic model on the same corpus; it learns A_S as that model does
    (its topics, projection and seed are copied) and needs labels. (A topic_model is trained
    by the one method whose spec is `exclusive_to` it.)"""
    head = spec.architecture
    assert isinstance(head, TopicHeadSpec)
    base = session.get(Model, head.base_model)
    if base is None or not isinstance(base.architecture, TopicModelSpec):
        raise unprocessable(
            "base_model_not_a_topic_model",
            f"base_model {head.base_model} is not a topic model",
        )
    if base.dataset_id != ds.id:
        raise unprocessable(
            "base_model_on_another_corpus",
            f"the head's dataset ({ds.id}) must be the base model's corpus ({base.dataset_id}): "
            "a removed document leaves both",
        )
    if ds.n_classes < 2:
        raise unprocessable("labels_needed", f"dataset {ds.id} has no labels for a head")
    arch = base.architecture
    return head.model_copy(
        update={"topics": arch.topics, "projection_dim": arch.projection_dim, "seed": arch.seed}
    )


def get_model(session: Session, model_id: int) -> Model:
    model = session.get(Model, model_id)
    if model is None:
        raise not_found("model", model_id)
    return model


# What a version's metrics show every role: what the released weights themselves
# show (accuracies of the release on the test split and on retained rows), the noise's
# data-free scale, and counts of retained rows. Everything else a release's metrics hold is a
# function of the removed rows or of which branch ran (noise-free norms, Newton steps, passes,
# per-request timings, the fallback's reason, forget-set accuracies) and goes to admins and
# auditors only: a list of what may be shown, so a metric added later is hidden until placed.
PUBLIC_METRICS = frozenset(
    {
        "test_accuracy",
        "test_accuracy_rows",
        "retain_accuracy",
        "retain_accuracy_rows",
        "train_accuracy",
        "n_train",
        "n_test",
        "sigma",
        "expected_noise_norm",
        "weights_norm",  # of the released (noised) weights, which anyone may download
        "noisy_steps",
        "finetune_epochs",
        "n_added",  # a learned version's appended rows: as public as n_train
        "learned_from_appends",
    }
)


def public_metrics(metrics: Any) -> dict[str, Any]:
    """The metrics every role may read (PUBLIC_METRICS); admins and auditors read them all."""
    if not isinstance(metrics, dict):
        return {}
    return {k: v for k, v in metrics.items() if k in PUBLIC_METRICS}


def version_view(
    version: ModelVersion,
    parent_number: int | None,
    forget_metrics: bool = False,
    mlflow: MlflowExport | None = None,
    mlflow_on: bool = False,
) -> dict[str, Any]:
    """A version; `forget_metrics` (admins, auditors) keeps every metric, else only the
    public ones of a version still served (a purged version's were measured on rows that
    may since have been erased)."""
    return {
        "number": version.number,
        "parent": parent_number,
        "kind": version.kind,
        "weights_sha256": version.weights_sha256,
        "weights_size": version.weights_size,
        "weights_available": version.weights_key is not None and version.erased_at is None,
        "metrics": version.metrics
        if forget_metrics
        else public_metrics(version.metrics if version.erased_at is None else {}),
        "n_train": version.n_train,
        "created_at": version.created_at,
        "erased_at": version.erased_at,
        "mlflow": export_view(mlflow) if mlflow is not None or not mlflow_on else _not_yet(version),
    }


def _not_yet(version: ModelVersion) -> dict[str, Any]:
    """The MLflow copy of a version the syncer has not reached (its row is made on the first
    attempt): pending, or skipped where Lethe purged it first (it never will be copied)."""
    return {
        "status": "pending" if version.erased_at is None else "skipped",
        "registered_model": None, "version": None, "run_id": None, "attempts": 0,
        "seconds": None, "last_error": None, "registered_at": None, "purged_at": None,
    }  # fmt: skip


def list_versions(
    session: Session, model_id: int, forget_metrics: bool = False, mlflow_on: bool = False
) -> list[dict[str, Any]]:
    """Every version of the model; with MLflow configured (`mlflow_on`), a version the
    syncer has not reached yet shows its copy `pending` with no attempt, not null."""
    get_model(session, model_id)
    versions = session.scalars(
        select(ModelVersion).where(ModelVersion.model_id == model_id).order_by(ModelVersion.number)
    ).all()
    numbers = {v.id: v.number for v in versions}
    copies = {
        e.version_id: e
        for e in session.scalars(select(MlflowExport).where(MlflowExport.model_id == model_id))
    }
    return [
        version_view(
            v,
            numbers[v.parent_id] if v.parent_id is not None else None,
            forget_metrics,
            copies.get(v.id),
            mlflow_on,
        )
        for v in versions
    ]


def model_view(session: Session, model: Model, forget_metrics: bool = False) -> dict[str, Any]:
    current = (
        session.get(ModelVersion, model.current_version_id) if model.current_version_id else None
    )
    parent = session.get(ModelVersion, current.parent_id) if current and current.parent_id else None
    # before its first version a model reports the rows it enrolled, read in O(1)
    n_train = current.n_train if current is not None else model.n_enrolled
    fields = (
        "id",
        "name",
        "dataset_id",
        "status",
        "progress",
        "error",
        "architecture",
        "training",
        "method",
        "privacy",
        "created_at",
    )
    return {
        **{f: getattr(model, f) for f in fields},
        "n_train": n_train,
        "current_version": version_view(current, parent.number if parent else None, forget_metrics)
        if current
        else None,
    }


# The current version in one query (the weights path reads it on every GET).
CURRENT_VERSION = (
    select(ModelVersion)
    .join(Model, Model.current_version_id == ModelVersion.id)
    .where(Model.id == bindparam("model_id"))
)


def get_version(session: Session, model_id: int, number: int | None) -> ModelVersion:
    """The numbered version, or the current one when `number` is None."""
    if number is None and (found := session.scalar(CURRENT_VERSION, {"model_id": model_id})):
        return found
    model = get_model(session, model_id)  # no current version: say why
    if number is None:
        if model.current_version_id is None and model.progress.stage == Stage.withdrawn:
            raise APIError(410, "model_withdrawn", model.error or "the model was withdrawn")
        if model.current_version_id is None:
            raise APIError(
                409,
                "no_version_yet",
                f"model {model_id} has no version yet (status {model.status})",
            )
        current = session.get(ModelVersion, model.current_version_id)
        assert current is not None
        return current
    version = session.scalar(
        select(ModelVersion).where(ModelVersion.model_id == model_id, ModelVersion.number == number)
    )
    if version is None:
        raise not_found("version", number, model_id=model_id)
    return version


def released_weights(session: Session, store: Blobs, version: ModelVersion) -> OpenBlob:
    """The safetensors blob users may download; 410 once the version was purged: by a
    deletion (trained on erased data) or, where its successor learned appended rows, because
    Lethe keeps the current version's weights only."""
    if version.erased_at is not None or version.weights_key is None:
        successor = session.scalar(
            select(ModelVersion).where(
                ModelVersion.model_id == version.model_id,
                ModelVersion.parent_id == version.id,
            )
        )
        details = {"erased_at": version.erased_at, "sha256": version.weights_sha256}
        superseded = (
            successor is not None
            and successor.kind == VersionKind.learned
            and not (successor.metrics or {}).get("n_removed")  # nothing removed with them
        )
        if superseded and successor is not None:
            raise APIError(
                410,
                "weights_superseded",
                f"version {version.number} was superseded by version {successor.number}, "
                "which learned appended rows; Lethe keeps the current version's weights only "
                "(metadata and hashes stay for the audit)",
                {**details, "superseded_by": successor.number},
            )
        raise APIError(
            410,
            "weights_erased",
            f"version {version.number} was trained on erased data; its weights "
            "are purged (metadata and hashes stay for the audit)",
            details,
        )
    handle = store.open(session, version.weights_key)
    if handle is None:
        raise APIError(410, "weights_erased", f"version {version.number} has no weights")
    return handle


def import_model(
    db: Database, store: Blobs, spec: ModelCreate, weights: bytes
) -> tuple[int, JsonObject]:
    """Seal and store the uploaded weights, then create the model that references them in one
    transaction; returns its id and view. A refusal deletes the stored object."""
    stored = store.write("imports", [weights])  # before the transaction: no lock held
    try:
        with db.write() as session:
            model = _import_model(session, store, spec, weights, stored)
            return model.id, model_view(session, model)
    except APIError:  # refused before any commit: nothing references the object
        store.discard([stored])
        raise


def _import_model(
    session: Session, store: Blobs, spec: ModelCreate, weights: bytes, stored: WrittenBlob
) -> Model:
    """A model trained elsewhere: its weights (`stored` already, sealed, before this
    transaction) are checked against the architecture now and loaded by the worker (status
    queued → ready). Only methods that need nothing recorded during training can serve it."""
    if spec.method.auto:
        raise unprocessable(
            "auto_needs_training",
            "auto chooses a method for a model Lethe trains; an imported model names its "
            "method: " + ", ".join(n for n in method_names() if not get_method(n).records_training),
        )
    if get_method(spec.method.name).records_training:
        usable = [n for n in method_names() if not get_method(n).records_training]
        raise unprocessable(
            "method_needs_training",
            f"{spec.method.name!r} needs Lethe to record or constrain training; "
            "an imported model can use: " + ", ".join(usable),
        )
    ds = ready_dataset(session, spec.dataset_id)
    check_weights(
        weights, spec.architecture.model_dump(), int(math.prod(ds.feature_shape)), ds.n_classes
    )
    model = create_model(session, spec)
    store.record(session, stored)
    imported = ImportedWeights(blob=stored.key, sha256=stored.sha256)
    model.training = model.training.model_copy(update={"imported": imported})
    model.progress = Progress(stage=Stage.importing)
    return model
