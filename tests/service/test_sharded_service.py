"""sharded_retrain through the service (SQLite and PostgreSQL): a subject deletion
retrains one shard, the released ensemble is bit for bit the one training from scratch on the
retained data gives, the checkpoints that saw the subject are gone, and a user can read the
cost of a deletion before choosing."""

from __future__ import annotations

import io

import numpy as np
import torch
from safetensors.torch import load as st_load
from sqlalchemy import select

from app.core.db.session import database
from app.core.db.tables import Blob, Dataset, Model, ModelVersion, ShortKey
from lethe.loader import load_model
from maths.ensemble import Ensemble, shard_states
from methods.compute import RetainedData, fit
from methods.sharded_retrain import maths as sh
from tests.conftest import Api
from tests.integration.test_erasure import wait_until_absent
from tests.support.factories import stored_bytes
from workers import load
from workers.data import training_arrays

N_TRAIN, N_TEST, PEOPLE = 240, 40, 30
METHOD = {"name": "sharded_retrain", "shards": 4, "slices": 3, "aggregation": "vote"}
TRAINING = {"epochs": 4, "batch_size": 16, "learning_rate": 0.1, "seed": 3}


def people(api: Api) -> dict:
    rng = np.random.default_rng(5)
    n = N_TRAIN + N_TEST
    y = rng.integers(0, 3, n)
    buf = io.BytesIO()
    np.savez(
        buf,
        X=(rng.normal(size=(n, 12)) + y[:, None]).astype(np.float32),
        y=y,
        subjects=np.array([f"person-{i % PEOPLE:02d}" for i in range(n)]),
        split=np.array(["train"] * N_TRAIN + ["test"] * N_TEST),
    )
    response = api.post("/v1/datasets", files={"file": ("people.npz", buf.getvalue())})
    assert response.status_code == 201, response.text
    return response.json()


def sharded_model(api: Api, dataset_id: int) -> dict:
    created = api.post(
        "/v1/models",
        json={
            "name": "sisa",
            "dataset_id": dataset_id,
            "architecture": {"type": "mlp", "hidden": [16]},
            "training": TRAINING,
            "method": METHOD,
        },
    )
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def weights(api: Api, model_id: int) -> bytes:
    response = api.get(f"/v1/models/{model_id}/weights", role="reader")
    assert response.status_code == 200, response.text
    return response.content


def current_state(api: Api, model_id: int) -> tuple[dict[str, torch.Tensor], str]:
    """The current version's noise-free state and its blob key."""
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        version = session.get(ModelVersion, model.current_version_id)
        data = stored_bytes(api.runtime.blobs, session, version.state_key)
        return dict(st_load(data)), version.state_key


def from_scratch(api: Api, model_id: int):
    """Training the model's recipe afresh on the samples it still holds, in this process."""
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        dataset = session.get(Dataset, model.dataset_id)
        spec = load.model_spec(model, dataset)
        data = training_arrays(session, api.opened(), model_id, dataset)
    return fit(
        spec, RetainedData(data.sample_ids, data.X, data.y, data.subjects, data.external_ids)
    )


def test_a_subject_deletion_retrains_one_shard_exactly_and_erases_its_checkpoints(
    api: Api,
) -> None:
    ds = people(api)
    model = sharded_model(api, ds["id"])
    mid = model["id"]
    v1 = weights(api, mid)
    loaded = load_model(v1)
    assert isinstance(loaded.module, Ensemble) and len(loaded.module.members) == 4
    assert loaded.metadata["shards"] == "4" and loaded.metadata["aggregation"] == "vote"
    metrics = model["current_version"]["metrics"]
    assert metrics["sisa"]["checkpoints"] == 8 and sum(metrics["sisa"]["shard_sizes"]) == N_TRAIN
    assert metrics["storage"]["state_bytes"] > metrics["storage"]["weights_bytes"] > 0
    old_state, old_key = current_state(api, mid)
    with database(api.url).read() as session:
        key_id = session.scalar(select(Blob.key_id).where(Blob.key == old_key))
        wrapped = session.scalar(select(ShortKey.wrapped).where(ShortKey.id == key_id))
    assert wrapped is not None

    request = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": ds["id"], "subject_ids": ["person-07"]},
    ).json()
    done = api.wait(f"/v1/deletions/{request['id']}", ("done", "failed"), timeout=300)
    assert done["status"] == "done", done
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["method"] == "sharded_retrain" and cert["guarantee"] == "exact"
    assert cert["epsilon"] == 0 and cert["delta"] == 0 and cert["n_removed"] == 8
    (retrained,) = cert["sharding"]["retrained"]  # one person, one shard
    assert retrained["removed"] == 8 and len(cert["sharding"]["reused_shards"]) == 3
    assert 0 < cert["sharding"]["work_fraction"] < 0.5
    assert cert["constants"]["work_fraction"]["source"] == "measured"
    assert f"shard {retrained['shard']} from slice {retrained['from_slice']}" in cert["sentence"]

    v2 = weights(api, mid)
    released = dict(st_load(v2))
    scratch = from_scratch(api, mid)
    assert released.keys() == scratch.state.keys()
    assert all(torch.equal(released[k], scratch.state[k]) for k in released), "not bit for bit"
    before, after = shard_states(dict(st_load(v1)), 4), shard_states(released, 4)
    changed = [
        k for k in range(4) if not all(torch.equal(before[k][n], after[k][n]) for n in after[k])
    ]
    assert changed == [retrained["shard"]]

    new_state, _ = current_state(api, mid)
    assert all(torch.equal(new_state[k], scratch.next_state[k]) for k in scratch.next_state)
    assert new_state[sh.ASSIGNMENT_IDS].numel() == N_TRAIN - 8
    saw_person = [  # the affected shard's checkpoints from the person's slice on
        n
        for j in range(retrained["from_slice"], 3)
        for n in old_state
        if n.startswith(sh.checkpoint_prefix(retrained["shard"], j))
    ]
    for name in saw_person:
        assert not torch.equal(new_state[name], old_state[name])
    # The only copy of them was version 1's state: its blob and its key are destroyed.
    assert api.get(f"/v1/models/{mid}/versions/1/weights").status_code == 410
    with database(api.url).read() as session:
        assert session.scalar(select(Blob.key).where(Blob.key == old_key)) is None
    wait_until_absent(api.url, {"version 1 state key": wrapped})

    preview = api.get("/v1/privacy/preview", params={"model": mid}).json()
    assert "deletion_cost" in preview, preview
    costs = {entry["method"]: entry for entry in preview["deletion_cost"]["methods"]}
    assert costs["retrain"]["fraction_of_full_retrain"] == 1.0
    sisa = costs["sharded_retrain"]
    assert 0 < sisa["fraction_of_full_retrain"] < 0.5
    assert sisa["measured_update_seconds"]["count"] == 1


def test_a_model_that_cannot_be_sharded_is_refused_with_nothing_written(api: Api) -> None:
    ds = people(api)
    before = api.get("/v1/models").json()
    response = api.post(
        "/v1/models",
        json={
            "name": "too many",
            "dataset_id": ds["id"],
            "method": {"name": "sharded_retrain", "shards": 32, "slices": 16},
        },
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "too_few_samples_for_shards"
    assert api.get("/v1/models").json() == before


def test_the_preview_offers_sharding_to_a_plain_model(api: Api, ready_model: dict) -> None:
    preview = api.get("/v1/privacy/preview", params={"model": ready_model["id"]}).json()
    entries = preview["deletion_cost"]["methods"]
    assert entries[0]["method"] == "retrain" and entries[0]["expected_compute_seconds"] > 0
    sharded = [e for e in entries if e["method"] == "sharded_retrain"]
    assert [e["options"] for e in sharded] == [
        {"shards": 4, "slices": 4},
        {"shards": 16, "slices": 4},
    ]
    assert all(e["basis"].startswith("estimated") for e in sharded)
    assert sharded[1]["fraction_of_full_retrain"] < sharded[0]["fraction_of_full_retrain"] < 1
