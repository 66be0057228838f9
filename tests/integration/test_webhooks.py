"""Webhooks: admins manage endpoints (SSRF refused unless allowed, secrets
shown once and rotated with a grace period); events are written to the outbox in the commit
that makes them and never carry a sample's id; a real receiver process verifies every
signature with the `standardwebhooks` package; when it is down the events wait and arrive
once it is up, after a kill -9 of the API between the commit and the delivery too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from redis import Redis
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook

from app.core.db.session import database
from app.core.db.tables import WebhookDelivery, utcnow
from tests.conftest import Api, train_ids, truncate_all
from tests.support.cluster import Cluster, free_port

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = ROOT / "tests" / "support" / "webhook_receiver.py"


def test_admins_manage_endpoints_and_private_urls_are_refused(api: Api) -> None:
    url = "http://127.0.0.1:9/hook"
    assert api.post("/v1/webhooks", role="requester", json={"url": url}).status_code == 403
    refused = api.post("/v1/webhooks", json={"url": url})
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "webhook_url_refused"
    embedded = (
        "http://[64:ff9b::7f00:1]/x",
        "http://[2002:7f00:1::]/x",
        "http://[::ffff:10.0.0.1]/",
    )
    for private in (
        "http://10.1.2.3/x",
        "http://169.254.169.254/latest",
        "http://[::1]:8/x",
        *embedded,
    ):
        answer = api.post("/v1/webhooks", json={"url": private})
        assert answer.json()["error"]["code"] == "webhook_url_refused", private
    scheme = api.post("/v1/webhooks", json={"url": "file:///etc/passwd"})
    assert scheme.status_code == 422
    unknown = api.post("/v1/webhooks", json={"url": url, "events": ["model.exploded"]})
    assert unknown.json()["error"]["code"] == "unknown_event"

    made = api.post(
        "/v1/webhooks",
        json={"url": url, "events": ["deletion.completed"], "allow_private": True},
    )
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["secret"].startswith("whsec_") and body["events"] == ["deletion.completed"]
    listed = api.get("/v1/webhooks").json()
    assert [e["id"] for e in listed] == [body["id"]] and listed[0]["secret"] is None
    rotated = api.post(f"/v1/webhooks/{body['id']}/rotate").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != body["secret"]
    assert rotated["previous_secret_until"] is not None
    assert api.client.delete(f"/v1/webhooks/{body['id']}", headers=api.h()).status_code == 204
    assert api.get(f"/v1/webhooks/{body['id']}").status_code == 404


def test_a_rotated_endpoint_signs_with_both_secrets(api: Api) -> None:
    """During the grace period every message carries a signature by the old secret and one by
    the new: a receiver holding either verifies it."""
    from app.core.webhooks.endpoints import secrets_of
    from app.core.webhooks.sender import signed_headers

    made = api.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "allow_private": True}
    ).json()
    new = api.post(f"/v1/webhooks/{made['id']}/rotate").json()["secret"]
    from app.core.db.tables import WebhookEndpoint

    with database(api.url).read() as session:
        endpoint = session.get(WebhookEndpoint, made["id"])
        assert endpoint is not None
        now = utcnow()
        secrets = secrets_of(api.runtime.keyring, endpoint, now)
        later = secrets_of(api.runtime.keyring, endpoint, now + timedelta(hours=25))
    assert len(secrets) == 2 and len(later) == 1  # the old one expires with its grace period
    body = '{"a": 1}'
    headers = signed_headers("msg_1", body, secrets, now)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (made["secret"], new):
        assert Webhook(secret).verify(body, headers) == {"a": 1}
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "QUFB" * 11).verify(body, headers)


def test_events_are_written_with_their_commit_and_carry_no_sample_id(
    api: Api, ready_model: dict
) -> None:
    hook = api.post(
        "/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "allow_private": True}
    ).json()
    dataset = ready_model["dataset_id"]
    ids = train_ids(api, dataset, 2)
    filed = api.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": ids})
    done = api.wait(f"/v1/deletions/{filed.json()['id']}", ("done",))
    with database(api.url).read() as session:
        rows = session.scalars(
            select(WebhookDelivery).where(WebhookDelivery.endpoint_id == hook["id"])
        ).all()
        kinds = sorted(r.event_type for r in rows)
        bodies = [r.body for r in rows]
    assert kinds == ["deletion.completed", "version.published"]
    completed = json.loads(next(b for b in bodies if "deletion.completed" in b))
    assert completed["specversion"] == "1.0" and completed["type"] == "dev.lethe.deletion.completed"
    assert completed["data"]["request_id"] == done["id"]
    assert completed["data"]["certificate_ids"] == done["certificate_ids"]
    assert completed["data"]["receipts"] == [
        f"/v1/deletions/{done['id']}/tlog-proofs/{c}" for c in done["certificate_ids"]
    ]
    for body in bodies:  # the ids the requester named never leave in an event
        assert not any(f'"{i}"' in body for i in ids)
    page = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()
    assert page["total"] == 2 and {d["event_type"] for d in page["items"]} == set(kinds)


# ---- a real receiver process ------------------------------------------------------------------


class Receiver:
    """tests/support/webhook_receiver.py on a fixed port: started, stopped and started again."""

    def __init__(self, port: int, out: Path, secrets: list[str]) -> None:
        self.port, self.out, self.secrets = port, out, secrets
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "LETHE_TEST_WEBHOOK_SECRETS": " ".join(self.secrets)}
        self.proc = subprocess.Popen(
            [sys.executable, str(RECEIVER), str(self.port), str(self.out)], env=env
        )
        import socket

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError("the receiver did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def seen(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines()]

    def wait_for(self, what: str, predicate, timeout: float = 120) -> list[dict]:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.seen() if e["valid"] and predicate(e)]
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {what} arrived: {self.seen()}")


@pytest.fixture(params=["embedded", pytest.param("distributed", marks=pytest.mark.postgres)])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """Embedded (the sender in the worker process), or distributed: PostgreSQL, Redis, the API
    and one `lethe worker` (the sender in the worker: the API process only serves)."""
    if request.param == "embedded":
        with Cluster(tmp_path / "data", None, None, webhook_backoff_seconds=0.2) as c:
            c.start_api()
            yield c
        return
    pg_url, redis_url = request.getfixturevalue("pg_url"), request.getfixturevalue("redis_url")
    truncate_all(pg_url)
    settings = {"webhook_backoff_seconds": 0.2, "heartbeat_seconds": 0.5, "lease_seconds": 3}
    with Cluster(tmp_path / "data", pg_url, redis_url, **settings) as c:
        c.start_api()
        c.start_worker()
        yield c
    Redis.from_url(redis_url).delete(f"rq:queue:{c.queue}")


def kill_the_sender(cluster: Cluster) -> Callable[[], object]:
    """kill -9 of the process that sends (the worker; embedded: the API, whose worker process
    dies with it); what starts it again."""
    if cluster.workers:
        cluster.kill(cluster.workers[-1])
        return cluster.start_worker
    assert cluster.api is not None
    cluster.api.kill()
    cluster.api.wait(timeout=30)
    return cluster.start_api


def _event(kind: str, **data: object):  # noqa: ANN202
    def match(e: dict) -> bool:
        body = json.loads(e["body"])
        return body["type"] == f"dev.lethe.{kind}" and all(
            body["data"].get(k) == v for k, v in data.items()
        )

    return match


@pytest.mark.integration
@pytest.mark.long
def test_a_receiver_gets_every_event_signed_and_none_is_lost_while_it_is_down(
    cluster: Cluster, tmp_path: Path
) -> None:
    port = free_port()
    with cluster.client() as c:
        hook = c.post(
            "/v1/webhooks",
            json={"url": f"http://127.0.0.1:{port}/hook", "allow_private": True},
        ).json()
        receiver = Receiver(port, tmp_path / "received.jsonl", [hook["secret"]])
        receiver.start()
        try:
            dataset = c.post("/v1/datasets", json={"builtin": "digits"}).json()["id"]
            receiver.wait_for("dataset.ready", _event("dataset.ready", dataset_id=dataset))
            model = c.post(
                "/v1/models",
                json={"name": "m", "dataset_id": dataset, "training": {"epochs": 2}},
            ).json()["id"]
            receiver.wait_for("v1", _event("version.published", model_id=model, version=1))
            ids = [
                s["external_id"]
                for s in c.get(
                    f"/v1/datasets/{dataset}/samples", params={"split": "train", "limit": 3}
                ).json()["items"]
            ]
            first = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": ids[:1]})
            first_id = first.json()["id"]
            got = receiver.wait_for(
                "deletion.completed", _event("deletion.completed", request_id=first_id)
            )
            assert got[0]["content_type"] == "application/cloudevents+json"

            receiver.stop()  # the receiver is down: the next events wait in the outbox
            second = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": ids[1:2]})
            second_id = second.json()["id"]
            deadline = time.monotonic() + 120
            while True:  # committed and tried at least once, in vain
                page = c.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"]
                tried = [d for d in page if d["event_type"] == "deletion.completed"
                         and d["attempts"] >= 1 and d["status"] == "pending"]  # fmt: skip
                if tried:
                    break
                assert time.monotonic() < deadline, page
                time.sleep(0.1)
            assert tried[0]["last_error"]  # why: the connection was refused
            restart = kill_the_sender(cluster)  # kill -9 between the commit and the delivery
            receiver.start()
            restart()
            receiver.wait_for(
                "the deletion.completed committed while the receiver was down",
                _event("deletion.completed", request_id=second_id),
            )
        finally:
            receiver.stop()
    seen = receiver.seen()
    assert seen and all(e["valid"] for e in seen)  # every request's signature verified
    for e in seen:  # no erased id in any event
        assert not any(f'"{i}"' in e["body"] for i in ids)
    by_id: dict[str, set[str]] = {}
    for e in seen:  # a duplicate (at least once) is the same message: same webhook-id, body
        by_id.setdefault(e["id"], set()).add(e["body"])
    assert all(len(bodies) == 1 for bodies in by_id.values())
    kinds = {json.loads(e["body"])["type"] for e in seen}
    assert {"dev.lethe.dataset.ready", "dev.lethe.version.published",
            "dev.lethe.deletion.completed"} <= kinds  # fmt: skip
