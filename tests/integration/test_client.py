"""The Python client against a real `lethe serve`: typed answers for every endpoint, typed
errors with the API's code, wait helpers with progress, sync and async."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.client import (
    AsyncClient,
    Client,
    Forbidden,
    Gone,
    Invalid,
    LetheError,
    NotFound,
    Unauthorized,
    Unreachable,
)
from app.core.wire import (
    AppendOut,
    AuditOut,
    CertificateOut,
    ChainCheck,
    DatasetOut,
    DeletionOut,
    KeyOut,
    ModelOut,
    PreviewOut,
    VersionOut,
)
from tests.support.cluster import Cluster, free_port

pytestmark = pytest.mark.integration
TRAINING = {"epochs": 3, "batch_size": 64, "learning_rate": 0.1, "seed": 0}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with Cluster(tmp_path / "data", None, None) as cluster:
        yield cluster.start_api(), cluster.admin_key


def test_the_sync_client_covers_the_api_with_types(served: tuple[str, str], tmp_path: Path) -> None:
    url, admin = served
    with Client(url, admin) as c:
        assert c.health().status == "ok" and c.me().role == "admin"
        ds = c.register_builtin("digits")
        assert isinstance(ds, DatasetOut) and c.dataset(ds.id).n_samples == 1797
        csv = tmp_path / "rows.csv"
        csv.write_text("id,x,label\n" + "".join(f"r{i},{i % 3},{i % 2}\n" for i in range(20)))
        assert c.upload_dataset(csv, "csv", id_column="id").n_samples == 20
        model = c.create_model({"name": "m", "dataset_id": ds.id, "training": TRAINING})
        assert isinstance(model, ModelOut)
        seen: list[ModelOut] = []
        assert c.wait_model(model.id, on_progress=seen.append).status == "ready"
        assert seen and all(m.id == model.id for m in seen)
        assert [m.id for m in c.models()] == [model.id]
        assert isinstance(c.version(model.id, 1), VersionOut)
        first = c.weights(model.id)
        sample = c.samples(ds.id, split="train", limit=2).items[0].external_id
        assert sample is not None
        requester = c.create_key("requester")
        assert isinstance(requester, KeyOut) and requester.key
        with Client(url, requester.key) as r:
            req = r.delete(ds.id, [sample], idempotency_key="t-1")
            assert isinstance(req, DeletionOut)
            progress: list[DeletionOut] = []
            done = r.wait_deletion(req.id, on_progress=progress.append, poll=2.0)
            assert done.status == "done" and progress[-1].status == "done"
            assert [d.id for d in r.deletions().items] == [req.id]
            with pytest.raises(Forbidden) as denied:
                r.verify()
            assert denied.value.code == "forbidden"
            with pytest.raises(Forbidden):  # a requester key reads no certificate
                r.certificate(done.certificate_ids[0])
            receipt = r.receipt(req.id, done.certificate_ids[0])  # but its receipt, yes
            assert receipt.startswith(b"c2sp.org/tlog-proof@v1\n")
        assert c.deletion(req.id).certificate_ids == done.certificate_ids
        certificate = c.certificate(done.certificate_ids[0])
        assert isinstance(certificate, CertificateOut) and certificate.guarantee == "exact"
        assert certificate.model_id == model.id and certificate.to_version == 2
        assert c.certificates(model=model.id)[0].id == certificate.id
        check = c.verify()
        assert isinstance(check, ChainCheck) and check.ok and check.checked == 1
        assert c.export().count(b"\n") == 1
        preview = c.preview(model.id)
        assert isinstance(preview, PreviewOut) and preview.guarantee == "exact"
        assert preview.target.epsilon == 1.0 and preview.lineage.releases_since_reset == 0
        assert len(c.versions(model.id)) == 2 and c.weights(model.id) != first
        with pytest.raises(Gone) as gone:
            c.weights(model.id, 1)
        assert gone.value.code == "weights_erased"
        with pytest.raises(NotFound) as missing:
            c.model(999)
        assert missing.value.code == "model_not_found" and missing.value.status == 404
        with pytest.raises(Invalid) as invalid:
            c.delete(ds.id, [sample], epsilon=-1.0)
        assert "epsilon: " in str(invalid.value)  # the field and its message, not just a code
        c.revoke_key(requester.id)

        rows = tmp_path / "more.npz"
        rng = np.random.default_rng(0)
        X = rng.integers(0, 16, (12, 8, 8)).astype(np.float32)  # digits: 8×8 images
        np.savez(rows, X=X, y=np.arange(12) % 10, ids=np.array([f"new-{i}" for i in range(12)]))
        appended = c.append_samples(ds.id, rows)
        assert isinstance(appended, AppendOut) and appended.n_samples == 12
        answers: list[AppendOut] = []
        settled = c.wait_append(ds.id, appended.id, on_progress=answers.append, poll=2.0)
        assert settled.status == "ready" and [t.status for t in settled.learning] == ["done"]
        assert answers[-1] == settled
        assert c.versions(model.id)[-1].kind == "learned"
        assert settled.learning[0].version_id is not None
    with Client(url, "lethe_wrong") as bad, pytest.raises(Unauthorized):
        bad.models()


def test_a_server_that_is_down_raises_a_lethe_error() -> None:
    """Nothing listens on the port: `Unreachable`, a LetheError naming the URL, from the
    sync and the async client alike (not the transport's raw exception)."""
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, "lethe_any") as c, pytest.raises(Unreachable) as down:
        c.models()
    assert isinstance(down.value, LetheError) and down.value.status == 0
    assert down.value.code == "unreachable" and url in str(down.value)

    async def async_models() -> None:
        async with AsyncClient(url, "lethe_any") as c:
            await c.models()

    with pytest.raises(Unreachable):
        asyncio.run(async_models())


def test_the_client_imports_neither_torch_nor_the_server_maths() -> None:
    """A client needs httpx and pydantic: `import app.client` loads no torch, scipy,
    dp-accounting, FastAPI or SQLAlchemy."""
    code = (
        "import sys, app.client\n"
        "heavy = ('torch', 'scipy', 'dp_accounting', 'fastapi', 'sqlalchemy', 'numpy', 'methods')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_async_client_waits_with_progress(served: tuple[str, str]) -> None:
    url, admin = served

    async def story() -> tuple[ModelOut, DeletionOut, list[str], AuditOut]:
        async with AsyncClient(url, admin) as c:
            ds = await c.register_builtin("digits")
            model = await c.create_model({"name": "a", "dataset_id": ds.id, "training": TRAINING})
            stages: list[str] = []
            model = await c.wait_model(model.id, on_progress=lambda m: stages.append(m.status))
            page = await c.samples(ds.id, split="train", limit=1)
            req = await c.delete(ds.id, [page.items[0].external_id or ""])
            done = await c.wait_deletion(req.id, poll=2.0)
            started = await c.start_audit(model.id, canaries=200, seed=1, control=False)
            audit = await c.wait_audit(started.id)
            return model, done, stages, audit

    model, done, stages, audit = asyncio.run(story())
    assert model.status == "ready" and stages[-1] == "ready"
    assert done.status == "done" and done.models[0].version == 2
    assert audit.status == "done" and audit.verdict in ("consistent", "violated")
