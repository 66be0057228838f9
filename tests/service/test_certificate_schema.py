"""The certificate's body is a versioned model (app/core/ledger/certificate_body.py) whose JSON
Schema is served: every body the log signs for a deletion holds to it."""

from __future__ import annotations

import json

import jsonschema_rs
import pytest
from sqlalchemy import select

from app.core.db.tables import Certificate
from app.core.ledger.certificate_body import SCHEMA_VERSION, DeletionCertificate
from tests.conftest import Api, train_ids

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_every_deletion_certificate_holds_to_the_served_schema(
    api: Api, digits: dict, ready_model: dict
) -> None:
    served = api.client.get("/v1/schemas/certificate.json")  # no key: a schema is public
    assert served.status_code == 200, served.text
    schema = served.json()
    assert schema["$id"].endswith("/v1/schemas/certificate.json")
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    validator = jsonschema_rs.validator_for(schema)
    for offset in (0, 10):  # two deletions, two certificates
        ids = train_ids(api, digits["id"], 2, offset)
        body = {"dataset_id": digits["id"], "sample_ids": ids}
        asked = api.post("/v1/deletions", json=body, role="requester")
        assert asked.status_code == 202, asked.text
        assert (
            api.wait(f"/v1/deletions/{asked.json()['id']}", ("done", "failed"))["status"] == "done"
        )
    with api.runtime.db.read() as session:
        bodies = [json.loads(b) for b in session.scalars(select(Certificate.body))]
    signed = [b for b in bodies if "removed_ids_commitment" in b]
    assert len(signed) == 2
    for body in signed:
        assert body["schema_version"] == SCHEMA_VERSION
        validator.validate(body)
        assert DeletionCertificate.model_validate(body).body().items() <= body.items()
    broken = {k: v for k, v in signed[0].items() if k != "epsilon"}
    assert not validator.is_valid(broken)  # a body without its ε does not pass
    assert not validator.is_valid({**signed[0], "guarantee": "probably"})
