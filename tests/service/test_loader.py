"""Released weights people can load: the safetensors metadata names the architecture and the
chain, and `lethe.load_model` rebuilds the module in one call."""

from __future__ import annotations

import json

import torch

from app.core.db.session import database
from app.core.db.tables import Dataset
from lethe import load_model, read_metadata
from tests.conftest import SMALL_TRAINING, Api
from workers import data as worker_data


def test_a_download_rebuilds_the_module_and_names_its_parent(api: Api, digits: dict) -> None:
    created = api.post(
        "/v1/models",
        json={
            "name": "mlp",
            "dataset_id": digits["id"],
            "architecture": {"type": "mlp", "hidden": [16]},
            "training": SMALL_TRAINING,
        },
    ).json()
    model = api.wait(f"/v1/models/{created['id']}", ("ready",))
    first = api.get(f"/v1/models/{model['id']}/weights", role="reader").content
    loaded = load_model(first)
    assert loaded.metadata["model_id"] == str(model["id"]) and loaded.version == 1
    assert json.loads(loaded.metadata["architecture"]) == model["architecture"]
    assert loaded.metadata["parent_sha256"] == ""
    with database(api.url).read() as session:
        test = worker_data.test_arrays(session, api.opened(), session.get(Dataset, digits["id"]))
    with torch.no_grad():
        accuracy = float((loaded.module(test.X).argmax(1) == test.y).float().mean())
    assert accuracy == model["current_version"]["metrics"]["test_accuracy"]

    page = api.get(f"/v1/datasets/{digits['id']}/samples", params={"limit": 1}).json()
    req = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": digits["id"], "sample_ids": [page["items"][0]["external_id"]]},
    ).json()
    api.wait(f"/v1/deletions/{req['id']}", ("done",))
    second = api.get(f"/v1/models/{model['id']}/weights", role="reader").content
    metadata = read_metadata(second)
    assert metadata["version"] == "2"
    assert metadata["parent_sha256"] == model["current_version"]["weights_sha256"]
