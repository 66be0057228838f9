"""Storing a version's blobs (its downloadable weights, with what a loader needs in their
safetensors metadata, and its noise-free state), sealed, before the commit that records
them: nothing here opens a transaction but the read of the metadata."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from app.core.db.session import Database
from app.core.db.tables import (
    Dataset,
    Model,
    ModelVersion,
)
from app.core.states import VersionKind
from app.core.storage.blobs import Blobs, WrittenBlob
from methods import method_of
from methods.compute import (
    ModelState,
    Release,
)
from workers import tensorfile
from workers.values import Batch


def weights_metadata(
    session: Session, model_id: int, number: int, parent_id: int | None, kind: VersionKind
) -> dict[str, str]:
    """String metadata of a released safetensors file: the architecture spec and the shapes
    that rebuild it (`lethe.load_model`), and where the version sits in its chain."""
    model = session.get(Model, model_id)
    assert model is not None
    dataset = session.get(Dataset, model.dataset_id)
    assert dataset is not None
    parent = session.get(ModelVersion, parent_id) if parent_id is not None else None
    return release_metadata(model, dataset, number, parent, kind)


def release_metadata(
    model: Model, dataset: Dataset, number: int, parent: ModelVersion | None, kind: VersionKind
) -> dict[str, str]:
    """`weights_metadata` from rows already read (an update reads them in its load)."""
    return {
        "format": "lethe/1",
        "model_id": str(model.id),
        "version": str(number),
        "kind": str(kind),
        "parent_sha256": parent.weights_sha256 if parent is not None else "",
        "architecture": json.dumps(model.architecture.model_dump(mode="json"), sort_keys=True),
        "method": model.method.name,
        "n_features": str(int(np.prod(dataset.feature_shape))),
        "feature_shape": json.dumps(list(dataset.feature_shape)),
        "n_classes": str(dataset.n_classes),
        **method_of(model.method).weights_metadata(),
    }


@dataclass(frozen=True)
class VersionBlobs:
    """A version's weights and noise-free state, sealed and stored before the commit that
    records them: no transaction is open while they stream out."""

    weights: WrittenBlob
    state: WrittenBlob

    @property
    def both(self) -> tuple[WrittenBlob, WrittenBlob]:
        return self.weights, self.state


def store_version_blobs(
    db: Database,
    store: Blobs,
    model_id: int,
    number: int,
    parent_id: int | None,
    kind: VersionKind,
    weights: ModelState,
    next_state: ModelState,
) -> VersionBlobs:
    """Seal and store a version's downloadable weights (with what a loader needs in their
    safetensors metadata, `weights_metadata`) and its noise-free state."""
    with db.read() as session:
        metadata = weights_metadata(session, model_id, number, parent_id, kind)
    return store_blobs(store, model_id, metadata, weights, next_state)


def store_blobs(
    store: Blobs,
    model_id: int,
    metadata: dict[str, str],
    weights: ModelState,
    next_state: ModelState,
) -> VersionBlobs:
    """Seal and store a version's weights under `metadata` and its noise-free state, each as
    a stream of views of the tensors' own memory (workers/tensorfile.py)."""

    def state() -> WrittenBlob:
        _, stream = tensorfile.encode(next_state)
        return store.write(f"model-{model_id}/state", stream, digest=False)

    # the two are written at once: each ends in an fsync of its file and of its folder, which
    # release the GIL. One
    # that fails leaves the other unreferenced: the sweeper removes it.
    writing = _WRITER.submit(state)
    _, stream = tensorfile.encode(weights, metadata)
    stored_weights = store.write(f"model-{model_id}/weights", stream)
    return VersionBlobs(stored_weights, writing.result())


_WRITER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lethe-blob")


def store_release(store: Blobs, batch: Batch, release: Release) -> VersionBlobs:
    """The blobs of the version a batch's update releases, their metadata from the batch's
    load: no database access here."""
    metadata = {**batch.weights_metadata, "kind": str(release.version_kind)}
    return store_blobs(store, batch.model_id, metadata, release.weights, release.next_state)
