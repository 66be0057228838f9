"""Builders shared by the tests and the benches: typed model specs, a removal split off
retained data, `UpdateInputs` for calling a method directly, and, through the running
service, deletions that wait for their certificate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from app.core.db.session import database
from app.core.db.tables import Dataset, Sample
from app.core.specs import PrivacyPolicy, TrainingConfig, architecture_of, training_of
from app.core.storage.blobs import Blobs
from app.core.storage.crypto import Keyring
from app.privacy.lineage import LineageEvent
from methods import method_of
from methods.compute import (
    ModelSpec,
    ModelState,
    PrivacyTarget,
    RemovedSamples,
    RetainedData,
    Trained,
    UpdateInputs,
)
from workers import data, tensorfile
from workers.data import Arrays

if TYPE_CHECKING:
    from tests.conftest import Api


def model_spec(
    architecture: dict[str, Any],
    method: dict[str, Any],
    n_features: int,
    n_classes: int,
    training: dict[str, Any] | TrainingConfig | None = None,
) -> ModelSpec:
    """A typed ModelSpec from the JSON a test or a bench writes down."""
    config = training if isinstance(training, TrainingConfig) else training_of(training or {})
    return ModelSpec(
        architecture_of(architecture), config, method_of(method), n_features, n_classes
    )


def split_off(
    data: RetainedData, gone: Sequence[int], trained: Trained | None = None
) -> tuple[RemovedSamples, RetainedData]:
    """The samples `gone` (ids) as a removal, with their recorded statistics if `trained`
    kept any, and the rest as the retained data."""
    gone_set = set(gone)
    out = [i for i, s in enumerate(data.sample_ids) if s in gone_set]
    keep = [i for i, s in enumerate(data.sample_ids) if s not in gone_set]
    stats = trained.statistics if trained is not None else None
    vectors = {s: stats.vectors[i] for i, s in enumerate(stats.sample_ids)} if stats else {}
    ids = [data.sample_ids[i] for i in out]
    removed = RemovedSamples(
        ids, data.X[out], data.y[out], {s: vectors[s] for s in ids if s in vectors}
    )
    retained = RetainedData(
        [data.sample_ids[i] for i in keep],
        data.X[keep],
        data.y[keep],
        [data.subjects[i] for i in keep] if data.subjects else [],
        [data.external_ids[i] for i in keep] if data.external_ids else [],
    )
    return removed, retained


def update_inputs(
    spec: ModelSpec,
    state: ModelState,
    removed: RemovedSamples,
    retained: RetainedData,
    *,
    policy: PrivacyPolicy | None = None,
    target: PrivacyTarget | None = None,
    test: RetainedData | None = None,
    history: list[LineageEvent] | None = None,
    record: dict[str, Any] | None = None,
    model_id: int = 1,
) -> UpdateInputs:
    """What the pipeline hands a method, built without the service: the policy's target
    unless another is given, an empty lineage unless one is given."""
    if policy is None:
        policy = (
            PrivacyPolicy(epsilon=target.epsilon, delta=target.delta) if target else PrivacyPolicy()
        )
    return UpdateInputs(
        model_id=model_id,
        spec=spec,
        method=spec.method,
        policy=policy,
        target=target or PrivacyTarget(policy.epsilon, policy.delta),
        state=state,
        removed=removed,
        retained=retained,
        test=test if test is not None else RetainedData([], retained.X[:0], retained.y[:0]),
        history=history or [],
        record=record,
    )


def separable_rows(n: int = 400, seed: int = 0) -> RetainedData:
    """n rows of 3 features in two well-separated classes (the first feature ±2 apart):
    logistic regression on them is flat far from its optimum, where a full Newton step
    overshoots (the far start of tests/unit/test_convex_removal.py)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.standard_normal((n, 3)) * 0.5
    X[:, 0] += np.where(y == 1, 2.0, -2.0)
    return RetainedData(list(range(n)), torch.tensor(X, dtype=torch.float32), torch.tensor(y))


# ---- through the service ----------------------------------------------------------------------


def forget(
    api: Api,
    dataset_id: int,
    ids: list[str],
    timeout: float = 300.0,
    method: str | None = None,
) -> dict[str, Any]:
    """POST a deletion of `ids` as a requester (with `method`, e.g. "retrain", if given) and
    wait for it; it must end `done`."""
    body: dict[str, Any] = {"dataset_id": dataset_id, "sample_ids": ids}
    if method:
        body["method"] = method
    response = api.post("/v1/deletions", role="requester", json=body)
    assert response.status_code == 202, response.text
    done = api.wait(f"/v1/deletions/{response.json()['id']}", ("done", "failed"), timeout)
    assert done["status"] == "done", done
    return done


def certificate_of(api: Api, done: dict[str, Any], index: int = 0) -> dict[str, Any]:
    """A finished request's certificate, as an auditor reads it."""
    cid = done["certificate_ids"][index]
    return api.get(f"/v1/audit/certificates/{cid}", role="auditor").json()


def stored_bytes(store: Blobs, session: Session, key: str) -> bytes | None:
    """A blob's plaintext as the service stores it (any backend), or None once erased."""
    data = store.read(session, key)
    return None if data is None else bytes(data)


def stored_state(store: Blobs, session: Session, key: str) -> dict[str, torch.Tensor]:
    """A stored safetensors blob (a noise-free state, weights) as tensors."""
    data = store.read(session, key)
    assert data is not None, f"blob {key} is erased"
    return tensorfile.decode(data)


def arrays_for(session: Session, ring: Keyring, dataset: Dataset, sample_ids: list[int]) -> Arrays:
    """These samples opened, in this order; an erased one's features and label are zeros and
    its ids empty (the tests read rows back with it; a worker opens rows with `workers.data`)."""
    rows = session.execute(data.sealed_samples().where(Sample.id.in_(sample_ids))).all()
    records = data._open_rows(session, ring, rows)
    shape = dataset.feature_shape
    n_feat = int(np.prod(shape)) if shape else 1
    X = np.zeros((len(sample_ids), n_feat), dtype=np.float32)
    y = np.zeros(len(sample_ids), dtype=np.int64)
    for i, sid in enumerate(sample_ids):
        if (record := records.get(sid)) is not None:
            X[i] = np.frombuffer(record.features, dtype=np.float32)
            y[i] = record.label
    return Arrays(
        sample_ids=list(sample_ids),
        external_ids=[records[s].external_id if s in records else "" for s in sample_ids],
        X=torch.from_numpy(X.reshape(len(sample_ids), *shape)),
        y=torch.from_numpy(y),
        subjects=[records[s].subject_id if s in records else None for s in sample_ids],
    )


def token_counts(
    url: str, dataset_id: int, tables: Sequence[Table], column: str
) -> tuple[int, int]:
    """(the dataset's tokens in these tables (a main one and its recent one), those whose
    sample is the dataset's row holding that token in `column` of `samples`)."""
    samples, tokens, matched = Sample.__table__, 0, 0
    with database(url).read() as session:
        for t in tables:
            mine = t.c.dataset_id == dataset_id
            tokens += session.scalar(select(func.count()).select_from(t).where(mine)) or 0
            matched += (
                session.scalar(
                    select(func.count())
                    .select_from(t)
                    .join(samples, samples.c.id == t.c.sample_id)
                    .where(
                        mine,
                        samples.c.dataset_id == dataset_id,
                        samples.c[column] == t.c.token,
                    )
                )
                or 0
            )
    return tokens, matched


def digits_split(n_train: int = 1400) -> tuple[RetainedData, RetainedData]:
    """scikit-learn's digits as retained data: the first `n_train` rows, and the rest."""
    d = load_digits()
    X = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target)
    ids = list(range(1, len(y) + 1))
    return (
        RetainedData(ids[:n_train], X[:n_train], y[:n_train]),
        RetainedData(ids[n_train:], X[n_train:], y[n_train:]),
    )
