"""API keys: 401 without or with a bad key, 403 for the wrong role, health needs none."""

from __future__ import annotations

import pytest

from app.core.db.session import database
from app.core.security import Role, create_key, hash_key, lookup_key
from tests.conftest import Api


def test_health_needs_no_key(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {
        "database": True,
        "queue": True,
        "restore": True,
    }
    # /metrics needs an admin or auditor key by default (LETHE_METRICS_ACCESS=key)
    metrics = api.get("/metrics", role="auditor").text
    assert "lethe_http_requests_total" in metrics and "lethe_deletion_tasks_queued" in metrics


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nope", "Basic abc"])
def test_missing_or_invalid_key_is_401(api: Api, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = api.client.get("/v1/models", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(
    "role,method,path,allowed",
    [
        ("reader", "post", "/v1/datasets", False),
        ("requester", "post", "/v1/models", False),
        ("reader", "post", "/v1/deletions", False),
        ("auditor", "post", "/v1/deletions", False),
        ("requester", "get", "/v1/audit/verify", False),
        ("reader", "get", "/v1/audit/verify", False),
        ("auditor", "get", "/v1/audit/verify", True),
        ("admin", "get", "/v1/audit/verify", True),
        ("requester", "post", "/v1/keys", False),
        ("reader", "get", "/v1/models", True),
    ],
)
def test_roles(api: Api, role: str, method: str, path: str, allowed: bool) -> None:
    response = getattr(api, method)(path, role=role, **({"json": {}} if method == "post" else {}))
    if allowed:
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"


def test_keys_are_stored_hashed_and_revocable(api: Api) -> None:
    created = api.post("/v1/keys", json={"role": "reader", "name": "serving"})
    assert created.status_code == 201
    raw = created.json()["key"]
    with database(api.url).write() as session:
        assert lookup_key(session, raw).key_hash == hash_key(raw) != raw
    headers = {"Authorization": f"Bearer {raw}"}
    assert api.client.get("/v1/models", headers=headers).status_code == 200
    assert api.client.delete(f"/v1/keys/{created.json()['id']}", headers=api.h()).status_code == 204
    assert api.client.get("/v1/models", headers=headers).status_code == 401


def test_create_key_function_returns_secret_once(api: Api) -> None:
    with database(api.url).write() as session:
        key, raw = create_key(session, Role.auditor, "x")
        assert raw.startswith("lethe_aud_") and key.prefix == raw[:14]


def test_keys_are_looked_up_once_then_remembered_until_revoked(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ingress gate's lookup is handed to the route's role check, and a verified key is
    remembered; revoking it forgets it at once."""
    import app.api.keycache

    calls: list[str] = []

    def counting(session, raw):  # type: ignore[no-untyped-def]
        calls.append(raw)
        return lookup_key(session, raw)

    cache = api.client.app.state.key_cache  # type: ignore[attr-defined]
    cache.forget()
    monkeypatch.setattr(app.api.keycache, "lookup_key", counting)
    # remembered for longer than these requests take, however busy the machine is
    monkeypatch.setattr(cache, "ttl", 600.0)
    response = api.post("/v1/datasets", json={"builtin": "breast_cancer"})
    assert response.status_code == 201 and len(calls) == 1
    assert api.get("/v1/models").status_code == 200 and len(calls) == 1  # remembered

    created = api.post("/v1/keys", json={"role": "reader"}).json()
    reader = {"Authorization": f"Bearer {created['key']}"}
    assert api.client.get("/v1/models", headers=reader).status_code == 200
    assert api.client.get("/v1/models", headers=reader).status_code == 200
    assert calls.count(created["key"]) == 1
    assert api.client.delete(f"/v1/keys/{created['id']}", headers=api.h()).status_code == 204
    assert api.client.get("/v1/models", headers=reader).status_code == 401  # forgotten at once
