"""An exact retrain is the same bits for the same rows, whatever their history: registered in
another order, half of them appended later, or left after a deletion of others (the rows train
in the order of their ids: methods/compute.py `canonical_order`); for the retrain and for SISA's
shards, each of which sees its rows in that order."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load

from tests.conftest import SMALL_TRAINING, Api
from tests.service.test_learning_service import learned
from tests.support.factories import forget

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

KEPT = [f"r{i:03d}" for i in range(240)]  # the retained rows, in every history
EXTRA = [f"x{i:02d}" for i in range(12)]  # one history holds them too, then erases them
_rng = np.random.default_rng(7)
_LABELS = {i: int(_rng.integers(0, 2)) for i in KEPT + EXTRA}
_FEATURES = {i: (_rng.normal(size=5) + _LABELS[i]).astype(np.float32) for i in KEPT + EXTRA}


def table(ids: list[str]) -> bytes:
    """These rows, in this order; every fifth kept row is a test row, in every history."""
    split = ["test" if i.startswith("r") and int(i[1:]) % 5 == 0 else "train" for i in ids]
    buffer = io.BytesIO()
    np.savez(
        buffer,
        X=np.stack([_FEATURES[i] for i in ids]),
        y=np.array([_LABELS[i] for i in ids]),
        ids=np.array(ids),
        split=np.array(split),
    )
    return buffer.getvalue()


def registered(api: Api, ids: list[str]) -> int:
    answer = api.post("/v1/datasets", files={"file": ("rows.npz", table(ids))})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


EXACT = [
    {"name": "retrain"},
    {"name": "sharded_retrain", "shards": 3, "slices": 2},
]


def retrained_model(api: Api, dataset_id: int, method: dict[str, object]) -> int:
    spec = {"name": "exact", "dataset_id": dataset_id, "architecture": {"type": "logreg"},
            "training": SMALL_TRAINING, "method": method}  # fmt: skip
    created = api.post("/v1/models", json=spec)
    assert created.status_code == 202, created.text
    ready = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert ready["status"] == "ready", ready
    return ready["id"]


def weights(api: Api, model_id: int, number: int) -> dict[str, torch.Tensor]:
    answer = api.get(f"/v1/models/{model_id}/versions/{number}/weights")
    assert answer.status_code == 200, answer.text
    return st_load(answer.content)


@pytest.mark.parametrize("method", EXACT, ids=[m["name"] for m in EXACT])
def test_the_same_retained_rows_give_the_same_bits_whatever_came_before(
    api: Api, method: dict[str, object]
) -> None:
    shuffled = [KEPT[i] for i in np.random.default_rng(1).permutation(len(KEPT))]

    erased = registered(api, KEPT + EXTRA)  # every row, then the extra ones erased
    after_erasure = retrained_model(api, erased, method)
    forget(api, erased, EXTRA)
    first = weights(api, after_erasure, 2)

    # the kept rows, in another order
    fresh = retrained_model(api, registered(api, shuffled), method)
    second = weights(api, fresh, 1)

    half = registered(api, shuffled[:120])  # half of them, the rest appended
    grown = retrained_model(api, half, method)
    appended = api.post(
        f"/v1/datasets/{half}/samples", files={"file": ("more.npz", table(shuffled[120:]))}
    )
    assert appended.status_code == 201, appended.text
    learned(api, half, appended.json()["id"])
    third = weights(api, grown, 2)

    assert first.keys() == second.keys() == third.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name
        assert torch.equal(first[name], third[name]), name
    # and the erased rows made a difference: the version that held them (purged) had others
    versions = api.get(f"/v1/models/{after_erasure}/versions").json()
    assert versions[0]["weights_sha256"] != versions[1]["weights_sha256"]
