"""What a release publishes besides its weights, tested with two worlds: two
services whose datasets hold the same retained rows and differ in the one row that is then
removed. World A removes an ordinary row, which convex_head releases with its own update;
world B removes an outlier at the clipping radius with the wrong label, whose measured bound
cannot be brought under λβ in one Newton step, so B releases the exact retrain through the
same mechanism. An auditor sees that the branches differed; every answer a reader or a
requester can read is the same in both worlds apart from the noised weights, what is a
function of them (their hash, their accuracies) and the clocks. And an explicit exact
retrain gives bit-identical weights in both worlds."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import Api, make_keys
from tests.service.test_convex_head import convex_model
from tests.support.factories import forget

N_RETAINED, FEATURES = 240, 4
# Functions of the noised weights (allowed to differ), ids the worlds share by construction
# aside, and clocks and signatures: the keys masked before two public answers are compared.
NOISED = {"weights_sha256", "weights_norm", "test_accuracy", "retain_accuracy", "train_accuracy"}
CLOCKS = {"created_at", "finished_at", "erased_at", "timestamp", "progress_at"}
HASHED = {
    "commitment",
    "release_sha256",
    "removed_ids_commitment",
    "entry_hash",
    "prev_hash",
    "leaf_hash",
    "root",
    "root_hash",
    "signature",
    "signed_head",
    "proof",
    "inclusion",
    "head",
    "checkpoint",
    "note",
    "key_id",  # each world signs with its own key
}


def retained_rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    X = rng.standard_normal((N_RETAINED, FEATURES))
    y = X @ np.array([1.0, -0.5, 0.25, 0.0]) + 0.3 * rng.standard_normal(N_RETAINED) > 0
    return X, y.astype(int)


def csv_of(X: np.ndarray, y: np.ndarray) -> bytes:
    header = "id," + ",".join(f"f{j}" for j in range(X.shape[1])) + ",label,split"
    lines = [header] + [
        f"row{i}," + ",".join(f"{v:.17g}" for v in x) + f",{label},{'test' if i < 40 else 'train'}"
        for i, (x, label) in enumerate(zip(X, y, strict=True))
    ]
    return "\n".join(lines).encode()


MOVER = f"row{N_RETAINED}"  # the last row: the one each world removes


def world_dataset(outlier: bool) -> bytes:
    """The retained rows and, last, the row that leaves: an ordinary one (A) or an outlier at
    the clipping radius with the other label (B)."""
    X, y = retained_rows()
    if outlier:
        direction = np.array([1.0, -0.5, 0.25, 0.0])
        row, label = 60.0 * direction / np.linalg.norm(direction), 0
    else:
        row, label = np.array([0.1, 0.0, 0.05, -0.1]), 1
    return csv_of(np.vstack([X, row]), np.append(y, label))


@contextmanager
def world(where: Path) -> Iterator[Api]:
    """A service of its own (one at a time: the embedded worker is one per process)."""
    where.mkdir()
    url = f"sqlite:///{where / 'lethe.db'}"
    settings = Settings(
        data_dir=where, database_url=url, redis_url=None, reconcile_seconds=0.5,
        bootstrap_admin_key=False,
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        yield Api(client=client, url=settings.resolved_database_url, keys=make_keys(url))


def setup_world(api: Api, outlier: bool) -> tuple[int, int]:
    """The world's dataset and its trained convex_head model."""
    response = api.post(
        "/v1/datasets",
        files={"file": ("d.csv", io.BytesIO(world_dataset(outlier)))},
        data={"id_column": "id", "split_column": "split"},
    )
    assert response.status_code == 201, response.text
    dataset = response.json()["id"]
    model = convex_model(api, dataset, beta=1e-2, newton_steps=1)  # λ = 1e-2, R = 8
    return dataset, model["id"]


def masked(value: Any) -> Any:
    """A public answer with what may differ between the worlds replaced by a marker (kept
    present, so a field that appears in one world only still shows)."""
    if isinstance(value, dict):
        if isinstance(value.get("entry"), str):  # a receipt's certificate, as logged
            value = {**value, "entry": json.loads(value["entry"])}
        return {
            k: "<noised>"
            if k in NOISED
            else "<clock>"
            if k in CLOCKS
            else "<hash>"
            if k in HASHED
            else masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str) and value.startswith("t:"):
        return "<token>"  # a keyed token: each world has its own key
    return value


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as paths with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b))
            for d in differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def public_answers(api: Api, dataset: int, model: int, request: int) -> dict[str, Any]:
    """Everything a reader or the requester can read about the model and the deletion."""
    answers = {
        "model": api.get(f"/v1/models/{model}", role="reader"),
        "models": api.get("/v1/models", role="reader"),
        "versions": api.get(f"/v1/models/{model}/versions", role="reader"),
        "version": api.get(f"/v1/models/{model}/versions/2", role="reader"),
        "deletion": api.get(f"/v1/deletions/{request}", role="requester"),
        "preview": api.get("/v1/privacy/preview", role="reader", params={"model": model}),
        "preview_requester": api.get(
            "/v1/privacy/preview", role="requester", params={"model": model}
        ),
        "methods": api.get(
            "/v1/privacy/methods",
            role="reader",
            params={"dataset": dataset, "architecture": "logreg"},
        ),
        "dataset": api.get(f"/v1/datasets/{dataset}", role="reader"),
        "samples": api.get(f"/v1/datasets/{dataset}/samples", role="reader", params={"limit": 500}),
        "samples_requester": api.get(
            f"/v1/datasets/{dataset}/samples", role="requester", params={"limit": 500}
        ),
    }
    for name, response in answers.items():
        assert response.status_code == 200, (name, response.text)
    for role in ("reader", "requester"):  # the operator's counters are not theirs
        assert api.get("/metrics", role=role).status_code in (401, 403)
    return {name: masked(response.json()) for name, response in answers.items()}


def branch_of(api: Api, done: dict[str, Any]) -> str:
    """Which branch ran, as only an auditor reads it."""
    cid = done["certificate_ids"][0]
    cert = api.get(f"/v1/audit/certificates/{cid}", role="auditor").json()
    return cert["branch"]


def test_two_worlds_differing_in_the_removed_row_publish_the_same(tmp_path: Path) -> None:
    seen: dict[str, dict[str, Any]] = {}
    branches: dict[str, str] = {}
    for name in ("A", "B"):
        with world(tmp_path / name) as api:
            seen[name], branches[name] = removed_in_world(api, outlier=name == "B")
    # the worlds did take different branches (else this test would show nothing)
    assert branches["A"] == "method", branches
    assert "exceeds the budget" in branches["B"], branches
    for name, answer in seen["A"].items():
        differ = differences(answer, seen["B"][name])
        assert not differ, (name, differ)
    version = seen["A"]["version"]
    assert version["kind"] == "unlearned"
    assert set(version["metrics"]) <= {
        "test_accuracy",
        "test_accuracy_rows",
        "retain_accuracy",
        "retain_accuracy_rows",
        "n_train",
        "n_test",
        "sigma",
        "expected_noise_norm",
        "weights_norm",  # ‖w̃‖ of the released (noised) weights: post-processing of them
    }, version["metrics"]


def removed_in_world(api: Api, outlier: bool) -> tuple[dict[str, Any], str]:
    """The world's public answers once its row is removed, and its branch (auditors')."""
    dataset, model = setup_world(api, outlier)
    done = forget(api, dataset, [MOVER])
    answers = public_answers(api, dataset, model, done["id"])
    answers["receipt"] = masked(done["receipts"][0])  # the requester's copy of the certificate
    return answers, branch_of(api, done)


def test_an_exact_retrain_is_a_function_of_the_retained_rows(tmp_path: Path) -> None:
    """The exact retrain starts cold: the same retained rows give the same tensors."""
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for name in ("A", "B"):
        with world(tmp_path / name) as api:
            dataset, model = setup_world(api, outlier=name == "B")
            done = forget(api, dataset, [MOVER], method="retrain")
            version = api.get(f"/v1/models/{model}/versions/2", role="reader").json()
            assert version["kind"] == "retrained", version
            cid = done["certificate_ids"][0]
            cert = api.get(f"/v1/audit/certificates/{cid}", role="auditor").json()
            assert cert["guarantee"] == "exact" and cert["lineage_reset"] is True
            weights = api.get(f"/v1/models/{model}/weights", role="reader")
            tensors[name] = load(weights.content)
    assert tensors["A"].keys() == tensors["B"].keys()
    for layer, value in tensors["A"].items():  # bit for bit (the file's metadata names its
        assert torch.equal(value, tensors["B"][layer]), layer  # parent, public before)
