"""Constant-time publication (the policy's `publish_after_seconds`): an update is committed no
earlier than that long after the newest request it serves was accepted, and its certificate
says so; without it, nothing waits and the certificate says nothing of it."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.conftest import SMALL_TRAINING, Api, train_ids
from tests.support.factories import forget

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

AFTER = 1.5


def retrained(api: Api, dataset_id: int, after: float | None) -> int:
    spec = {"name": "timed", "dataset_id": dataset_id, "training": SMALL_TRAINING,
            "privacy": {"publish_after_seconds": after}}  # fmt: skip
    created = api.post("/v1/models", json=spec)
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model["id"]


def test_an_update_is_published_no_earlier_than_its_deadline(api: Api, digits: dict) -> None:
    timed = retrained(api, digits["id"], AFTER)
    done = forget(api, digits["id"], train_ids(api, digits["id"], 1))
    took = datetime.fromisoformat(done["finished_at"]) - datetime.fromisoformat(done["created_at"])
    assert took.total_seconds() >= AFTER, done
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["model_id"] == timed and cert["publish_after_seconds"] == AFTER
    assert f"no earlier than {AFTER:g} s" in cert["sentence"]


def test_without_the_option_nothing_waits_or_is_said(api: Api, digits: dict) -> None:
    retrained(api, digits["id"], None)
    done = forget(api, digits["id"], train_ids(api, digits["id"], 1))
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert "publish_after_seconds" not in cert and "no earlier than" not in cert["sentence"]


def test_a_deadline_past_a_day_is_refused(api: Api, digits: dict) -> None:
    spec = {"name": "x", "dataset_id": digits["id"], "privacy": {"publish_after_seconds": 1e6}}
    answer = api.post("/v1/models", json=spec)
    assert answer.status_code == 422 and "publish_after_seconds" in answer.text
