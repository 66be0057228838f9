"""Migration 0003 seals a database written before crypto-shredding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import sqlalchemy as sa
import torch
from alembic import command

from app.core.db.migrate import alembic_config
from app.core.db.session import database, engine_for
from app.core.db.tables import Dataset
from app.core.settings import Settings
from app.core.storage.blobs import blobs
from app.core.storage.crypto import keyring
from tests.support.factories import arrays_for, stored_bytes
from workers.statistics import read_vectors


def test_plaintext_rows_are_sealed_and_still_read(tmp_path: Path) -> None:
    """Migration 0003 seals what an older database kept in plaintext, under the master key of
    the settings it is given (`upgrade_to_head`'s), and the worker's reads open it."""
    settings = Settings(data_dir=tmp_path)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0002")
    features = np.arange(4, dtype=np.float32) + 0.25
    vector = np.full(3, 7.5, dtype=np.float32)
    weights = b"old-weights-" * 20
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO datasets (id, name, kind, source, feature_shape, n_classes, n_samples,"
            " created_at) VALUES (1, 'd', 'tabular', 'npz', '[4]', 2, 2, '2026-01-01')"
        )
        conn.execute(
            sa.text(
                "INSERT INTO samples (id, dataset_id, external_id, subject_id, split, payload,"
                " label, status) VALUES (1, 1, 'alice-sample', 'alice', 'train', :p, 1, 'active'),"
                " (2, 1, 'bob-sample', NULL, 'train', NULL, NULL, 'erased')"
            ),
            {"p": features.tobytes()},
        )
        conn.exec_driver_sql(
            "INSERT INTO models (id, name, dataset_id, architecture, training, method, privacy,"
            " status, progress, created_at, updated_at) VALUES (1, 'm', 1, '{}', '{}', '{}',"
            " '{}', 'ready', '{}', '2026-01-01', '2026-01-01')"
        )
        conn.execute(
            sa.text(
                "INSERT INTO sample_statistics (model_id, sample_id, kind, dtype, norm, vector)"
                " VALUES (1, 1, 'v', 'float32', 1.0, :v), (1, 2, 'v', 'float32', 1.0, :v)"
            ),
            {"v": vector.tobytes()},
        )
        conn.execute(
            sa.text(
                "INSERT INTO blobs (key, data, size, sha256, created_at)"
                " VALUES ('model-1/weights/x', :d, 240, 'h', '2026-01-01')"
            ),
            {"d": weights},
        )
        conn.exec_driver_sql(
            "INSERT INTO deletion_requests (id, dataset_id, fingerprint, selector, sample_ids,"
            " already_erased, status, created_at, updated_at) VALUES (1, 1, 'f',"
            " '{\"sample_ids\": [\"bob-sample\"], \"subject_ids\": []}', '[2]', '[]', 'done',"
            " '2026-01-01', '2026-01-01')"
        )
    engine.dispose()

    command.upgrade(alembic_config(url, settings), "head")

    raw = Path(url.removeprefix("sqlite:///")).read_bytes()
    for plaintext in (features.tobytes(), vector.tobytes(), weights[:24], b"alice", b"bob-sample"):
        assert plaintext not in raw
    db = database(url)
    with db.read() as session:
        ds = session.get(Dataset, 1)
        assert ds is not None
        arrays = arrays_for(session, keyring(settings), ds, [1, 2])
        assert arrays.external_ids == ["alice-sample", ""]
        assert arrays.subjects == ["alice", None]
        assert torch.equal(arrays.X[0], torch.from_numpy(features))
        assert int(arrays.y[0]) == 1
        vectors = read_vectors(session, keyring(settings), 1, [1])
        assert torch.equal(vectors[1], torch.from_numpy(vector))
        assert stored_bytes(blobs(settings), session, "model-1/weights/x") == weights
        left = session.execute(sa.text("SELECT count(*) FROM sample_statistics")).scalar_one()
        assert left == 1  # the erased sample's statistic went with it
    engine_for(url).dispose()
