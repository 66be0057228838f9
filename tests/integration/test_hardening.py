"""Holes found by probing: a database outage, text that is not Unicode, locking every admin
out, and who may read /metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database, engine_for
from app.core.errors import RETRY_AFTER_SECONDS
from app.core.security import lookup_key
from app.core.settings import Settings
from app.main import create_app
from tests.conftest import Api, make_keys
from tests.support.databases import PG_ADMIN_URL, own_database
from tests.support.servers import free_port

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def assert_unavailable(response, code: str = "database_unavailable") -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def bearer(raw: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {raw}"}


# ---- A. the database or the queue cannot be reached -------------------------------------------


def test_unreachable_database_is_503_with_retry_after(tmp_path: Path) -> None:
    """PostgreSQL URL on a port where nothing listens: 503 + Retry-After, never 500, both from
    the ingress key check (a POST with a body) and from a route's own dependency (a GET)."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/lethe",
        redis_url=DEAD_REDIS,  # distributed mode: the lifespan does not migrate
        bootstrap_admin_key=False,
    )
    try:
        with TestClient(create_app(settings)) as client:
            headers = bearer("lethe_adm_whatever")
            body = {"dataset_id": 1, "sample_ids": ["1"]}
            assert_unavailable(client.post("/v1/deletions", json=body, headers=headers))
            assert_unavailable(client.get("/v1/deletions/1", headers=headers))
            assert_unavailable(client.get("/v1/models", headers=headers))
            assert client.get("/readyz").status_code == 503
            assert client.get("/healthz").status_code == 200
    finally:
        engine_for(settings.resolved_database_url).dispose()


@pytest.fixture
def own_pg_database() -> Iterator[str]:
    """A PostgreSQL database this test creates (and alone may close and drop)."""
    with own_database("lethe_outage") as url:
        yield url


def set_connectable(url: str, allowed: bool) -> None:
    """Open or close our own database to new connections; closing also ends the open ones."""
    name = url.rsplit("/", 1)[1]
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(
            f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"true" if allowed else "false"}'
        )
        if not allowed:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
    admin.dispose()


@pytest.mark.postgres
def test_a_pooled_connection_is_pinged_only_after_sitting_idle(
    own_pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkout pings a server connection only after it sat idle for
    PING_AFTER_IDLE_SECONDS (a ping per checkout was a round trip per transaction); one that
    died while idle fails its ping and the pool hands out a fresh one, so the caller's
    statement runs."""
    from app.core.db import session as db_session

    engine = db_session.make_engine(own_pg_database)
    pings: list[int] = []
    ping = engine.dialect.do_ping
    monkeypatch.setattr(engine.dialect, "do_ping", lambda conn: pings.append(1) or ping(conn))
    monkeypatch.setattr(db_session, "PING_AFTER_IDLE_SECONDS", 0.2)
    backend = "SELECT pg_backend_pid()"
    try:
        with engine.connect() as conn:
            first = conn.exec_driver_sql(backend).scalar()
        for _ in range(3):  # used again at once: no ping
            with engine.connect() as conn:
                assert conn.exec_driver_sql(backend).scalar() == first
        assert pings == []
        with sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as admin:
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        time.sleep(0.3)  # idle past the threshold: the next checkout pings, finds it dead
        with engine.connect() as conn:
            assert conn.exec_driver_sql(backend).scalar() != first
        assert pings
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_reads_keep_their_statements_prepared(own_pg_database: str) -> None:
    """A query run more than psycopg's prepare threshold (5) is prepared on the server and
    stays so from read to read: a read ends with COMMIT, where a ROLLBACK made psycopg forget
    (DEALLOCATE ALL) every prepared statement of the connection."""

    db = database(own_pg_database)
    query = sa.select(sa.literal_column("count(*)")).select_from(sa.table("models"))
    try:
        for _ in range(8):
            with db.read() as session:
                session.execute(query).scalar_one()
        with db.read() as session:
            prepared = session.execute(
                sa.text("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE :q"),
                {"q": "%FROM models%"},
            ).scalar_one()
        assert prepared == 1
    finally:
        db.engine.dispose()


@pytest.mark.postgres
def test_only_bookkeeping_commits_skip_the_wait_for_the_disk(own_pg_database: str) -> None:
    """`write(durable=False)` (claims, leases) commits with synchronous_commit off, set once
    per connection rather than by a `SET LOCAL` round trip per transaction; `write()` and
    `read()` keep PostgreSQL's default, so what a client is told is committed is on disk."""
    from app.core.db.session import dispose_engines

    db = database(own_pg_database)
    show = sa.text("SHOW synchronous_commit")
    sent: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", seen)
    try:
        for _ in range(2):  # a pooled connection keeps it
            with db.write(durable=False) as session:
                assert session.execute(show).scalar_one() == "off"
        with db.write() as session:
            assert session.execute(show).scalar_one() == "on"
        with db.read() as session:
            assert session.execute(show).scalar_one() == "on"
        assert sent == ["SHOW synchronous_commit"] * 4  # no SET LOCAL in between
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", seen)
        dispose_engines(own_pg_database)


@pytest.mark.postgres
def test_reads_and_single_statements_send_no_begin_or_commit(
    own_pg_database: str, tmp_path: Path
) -> None:
    """On PostgreSQL a read and `single()` send their statements alone, in autocommit: no
    BEGIN and no COMMIT, two round trips fewer each; `write()` still sends both
    around its statements, and what `single()` wrote is committed when it returns."""
    from psycopg import pq

    from app.core.db.session import dispose_engines

    db = database(own_pg_database)
    select_one = sa.text("SELECT 1")

    def traced(open_session: Any, statement: Any) -> str:
        """libpq's trace of the messages the session sent, from its first statement on."""
        trace = tmp_path / "trace.txt"
        with trace.open("w") as out:
            with open_session() as session:
                pgconn = session.connection().connection.dbapi_connection.pgconn
                pgconn.trace(out.fileno())
                pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                session.execute(statement)
            pgconn.untrace()  # after the session's end: its COMMIT, if any, is in the trace
        return trace.read_text()

    try:
        with db.write() as session:
            session.execute(sa.text("CREATE TABLE single_probe (x int)"))
        for _ in range(2):  # a pooled connection, back from another mode, behaves the same
            read = traced(db.read, select_one)
            assert '"SELECT 1"' in read
            assert '"BEGIN"' not in read and '"COMMIT"' not in read
            written = traced(db.write, select_one)
            assert '"BEGIN"' in written and '"COMMIT"' in written
            for durable in (True, False):
                single = traced(
                    lambda d=durable: db.single(durable=d),
                    sa.text("INSERT INTO single_probe VALUES (1)"),
                )
                assert "INSERT INTO single_probe" in single
                assert '"BEGIN"' not in single and '"COMMIT"' not in single
        with db.read() as session:
            assert session.execute(sa.text("SELECT count(*) FROM single_probe")).scalar() == 4
    finally:
        dispose_engines(own_pg_database)


@pytest.mark.postgres
def test_statements_on_the_key_table_are_never_prepared(own_pg_database: str) -> None:
    """Reads and deletions of data keys by id are planned with their ids every time (each
    compaction rewrites key partitions, invalidating a prepared plan, and PostgreSQL then
    re-planned over all 128 partitions), while the connection's other statements are still
    prepared, and errors still come through SQLAlchemy."""
    from app.core.storage.crypto import Keyring
    from app.core.storage.keystore import create_keys, destroy_keys, load_keys

    db, ring = database(own_pg_database), Keyring(b"k" * 32)
    other = sa.select(sa.literal_column("count(*)")).select_from(sa.table("models"))
    try:
        for _ in range(8):
            with db.write() as session:
                made = create_keys(session, ring, 2)
                ids = [key_id for key_id, _ in made]
                assert load_keys(session, ring, ids) == dict(made)
                assert destroy_keys(session, ids) == 2
                session.execute(other).scalar_one()
        with db.read() as session:
            assert load_keys(session, ring, ids) == {}
            prepared = (
                session.execute(sa.text("SELECT statement FROM pg_prepared_statements"))
                .scalars()
                .all()
            )
            with pytest.raises(sa.exc.DBAPIError):  # wrapped as SQLAlchemy's, not psycopg's
                destroy_keys(session, ["not a uuid"])  # type: ignore[list-item]
        by_id = [s for s in prepared if "data_keys" in s and not s.startswith("INSERT")]
        assert not by_id, prepared  # an insert is routed to its partition when it runs
        assert [s for s in prepared if "FROM models" in s]
    finally:
        db.engine.dispose()


@pytest.mark.postgres
def test_a_commit_finds_the_live_versions_without_reading_the_erased_ones(
    own_pg_database: str,
) -> None:
    """Each commit purges the model's older versions; with migration 0017's partial index
    it reads only the versions whose bytes are kept, not every version the model ever had
    (a cost that grew with each deletion)."""
    from app.core.db.tables import ModelVersion
    from workers import statements

    engine = sa.create_engine(own_pg_database)
    versions = ModelVersion.__table__
    now = datetime.now(UTC)
    row = {"model_id": 1, "kind": "unlearned", "weights_sha256": "0" * 64, "weights_size": 1,
           "metrics": {}, "n_train": 1, "created_at": now}  # fmt: skip
    erased = [{**row, "number": i, "erased_at": now} for i in range(1, 3001)]
    live = [{**row, "number": i, "erased_at": None} for i in (3001, 3002)]
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no model row
            conn.execute(versions.insert(), erased + live)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE model_versions")
            keep = conn.execute(
                sa.select(versions.c.id).where(versions.c.number == 3002)
            ).scalar_one()
            query = statements.OLDER_VERSIONS.params(model=1, keep=keep).compile(
                dialect=conn.dialect, compile_kwargs={"literal_binds": True}
            )
            plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").scalar_one()
            found = conn.execute(statements.OLDER_VERSIONS, {"model": 1, "keep": keep})
            assert len(found.all()) == 1
            purge = statements.PURGE_AT_ONCE.compile(dialect=conn.dialect)
            purge_plan = conn.exec_driver_sql(  # the commit's statement on PostgreSQL: not run
                f"EXPLAIN (FORMAT JSON) {purge}", {"model": 1, "keep": keep, "now": now}
            ).scalar_one()
    finally:
        engine.dispose()
    top = plan[0]["Plan"]
    assert top.get("Index Name") == "ix_model_versions_live", top
    assert '"Index Name": "ix_model_versions_live"' in json.dumps(purge_plan), purge_plan
    assert top["Actual Rows"] + top.get("Rows Removed by Filter", 0) <= 2, top


@pytest.mark.postgres
def test_database_outage_is_503_and_recovers(own_pg_database: str, tmp_path: Path) -> None:
    url = own_pg_database
    keys = make_keys(url)
    settings = Settings(
        data_dir=tmp_path, database_url=url, redis_url=None, bootstrap_admin_key=False
    )
    with TestClient(create_app(settings)) as client:
        ds = client.post(
            "/v1/datasets",
            json={"builtin": "synthetic", "n_samples": 20},
            headers=bearer(keys["admin"]),
        )
        assert ds.status_code == 201, ds.text
        body = {"dataset_id": ds.json()["id"], "sample_ids": ["0"]}
        assert client.get("/v1/models", headers=bearer(keys["reader"])).status_code == 200

        set_connectable(url, False)
        try:
            response = client.post("/v1/deletions", json=body, headers=bearer(keys["requester"]))
            assert_unavailable(response)
            assert_unavailable(client.get("/v1/deletions/1", headers=bearer(keys["auditor"])))
            assert_unavailable(client.get("/v1/models", headers=bearer(keys["reader"])))
            assert client.get("/readyz").status_code == 503
        finally:
            set_connectable(url, True)
        assert client.get("/v1/models", headers=bearer(keys["reader"])).status_code == 200
        accepted = client.post("/v1/deletions", json=body, headers=bearer(keys["requester"]))
        assert accepted.status_code == 202, accepted.text


def test_queue_down_after_commit_still_acknowledges(tmp_path: Path) -> None:
    """Redis unreachable when signalling: the model was committed, so 202 (the reconciler
    re-signals it later), not 503."""
    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    keys = make_keys(url)
    settings = Settings(
        data_dir=tmp_path, database_url=url, redis_url=DEAD_REDIS, bootstrap_admin_key=False
    )
    try:
        with TestClient(create_app(settings)) as client:
            admin = bearer(keys["admin"])
            ds = client.post("/v1/datasets", json={"builtin": "breast_cancer"}, headers=admin)
            model = client.post(
                "/v1/models", json={"name": "m", "dataset_id": ds.json()["id"]}, headers=admin
            )
            assert model.status_code == 202, model.text
            stored = client.get(f"/v1/models/{model.json()['id']}", headers=admin).json()
            assert stored["status"] == "queued"
            assert client.get("/readyz").json()["checks"]["queue"] is False
    finally:
        engine_for(url).dispose()


def test_queue_error_escaping_a_route_is_503(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'x.db'}",
        redis_url=DEAD_REDIS,
        bootstrap_admin_key=False,
    )
    app = create_app(settings)

    @app.get("/queue-touching")
    def _touch() -> None:
        raise RedisConnectionError("Connection refused")

    with TestClient(app) as client:
        assert_unavailable(client.get("/queue-touching"), "queue_unavailable")


# ---- B. text that is not Unicode: 422, never 500 ----------------------------------------------

SURROGATE = "\\ud800"  # a JSON escape of a lone surrogate, as it appears in the raw body


def post_raw(api: Api, path: str, body: str, role: str = "admin"):
    return api.client.post(
        path, content=body.encode(), headers={**api.h(role), "Content-Type": "application/json"}
    )


def assert_invalid(response) -> None:
    assert response.status_code == 422, response.text
    assert set(response.json()["error"]) == {"code", "message", "details"}


TEXT_CASES = [
    ("/v1/deletions", '{"dataset_id": DS, "sample_ids": ["S"]}'),
    ("/v1/deletions", '{"dataset_id": DS, "sample_ids": ["ok", "aSb"]}'),
    ("/v1/deletions", '{"dataset_id": DS, "subject_ids": ["S"]}'),
    ("/v1/deletions", '{"dataset_id": DS, "sample_ids": ["0"], "method": "S"}'),
    ("/v1/models", '{"name": "S", "dataset_id": DS}'),
    ("/v1/models", '{"name": "m", "dataset_id": DS, "method": {"name": "S"}}'),
    ("/v1/models", '{"name": "m", "dataset_id": DS, "method": {"name": "retrain", "S": 1}}'),
    ("/v1/models", '{"name": "m", "dataset_id": DS, "architecture": {"type": "S"}}'),
    ("/v1/keys", '{"role": "reader", "name": "S"}'),
    ("/v1/keys", '{"role": "S"}'),
    ("/v1/datasets", '{"builtin": "digits", "name": "S"}'),
    ("/v1/datasets", '{"builtin": "S"}'),
]


@pytest.mark.parametrize("bad", [SURROGATE, "\\u0000"], ids=["surrogate", "nul"])
def test_json_text_must_be_unicode(api: Api, digits: dict, bad: str) -> None:
    """Every JSON route that takes strings: a lone surrogate or a NUL anywhere is 422."""
    for path, template in TEXT_CASES:
        body = template.replace("DS", str(digits["id"])).replace("S", bad)
        role = "requester" if path == "/v1/deletions" else "admin"
        assert_invalid(post_raw(api, path, body, role))
    with database(api.url).read() as session:  # nothing was stored
        assert session.scalar(sa.text("SELECT count(*) FROM deletion_requests")) == 0
        assert session.scalar(sa.text("SELECT count(*) FROM models")) == 0


def test_import_form_json_text_must_be_unicode(api: Api, digits: dict) -> None:
    response = api.post(
        "/v1/models/import",
        files={"weights": ("w.safetensors", b"\x00" * 16)},
        data={
            "name": "imported",
            "dataset_id": str(digits["id"]),
            "architecture": '{"type": "logreg"}',
            "method": '{"name": "retrain", "' + SURROGATE + '": 1}',
        },
    )
    assert_invalid(response)


@pytest.mark.parametrize(
    "path",
    ["/v1/datasets/DS/samples?subject={}", "/v1/audit/certificates?subject={}"],
)
def test_query_text(api: Api, digits: dict, path: str) -> None:
    path = path.replace("DS", str(digits["id"]))
    # percent-encoded UTF-8 of a lone surrogate decodes to U+FFFD: a harmless unknown subject
    assert api.get(path.format("%ED%A0%80")).status_code == 200
    assert_invalid(api.get(path.format("%00")))


# ---- C. nobody can lock every admin out ---------------------------------------------------


def key_id(api: Api, raw: str) -> int:
    with database(api.url).read() as session:
        key = lookup_key(session, raw)
        assert key is not None
        return key.id


def test_last_admin_key_cannot_be_revoked(api: Api) -> None:
    response = api.client.delete(f"/v1/keys/{key_id(api, api.keys['admin'])}", headers=api.h())
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "last_admin_key"
    assert api.get("/v1/models").status_code == 200


def test_admin_cannot_revoke_its_own_key(api: Api) -> None:
    other = api.post("/v1/keys", json={"role": "admin", "name": "second admin"}).json()
    mine = key_id(api, api.keys["admin"])
    response = api.client.delete(f"/v1/keys/{mine}", headers=api.h())
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "own_key"
    # another admin may revoke it, and then its key may not revoke the last admin left
    assert api.client.delete(f"/v1/keys/{mine}", headers=bearer(other["key"])).status_code == 204
    assert api.get("/v1/models").status_code == 401
    last = api.client.delete(f"/v1/keys/{other['id']}", headers=bearer(other["key"]))
    assert last.status_code == 409 and last.json()["error"]["code"] == "last_admin_key"
    # other roles' keys are revoked as before
    reader = api.client.post("/v1/keys", json={"role": "reader"}, headers=bearer(other["key"]))
    gone = api.client.delete(f"/v1/keys/{reader.json()['id']}", headers=bearer(other["key"]))
    assert gone.status_code == 204


# ---- D. who may read /metrics -------------------------------------------------------------


def metrics_app(settings: Settings, **changes) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=changes)))


def test_metrics_need_an_admin_or_auditor_key_by_default(api: Api) -> None:
    assert Settings().metrics_access == "key"
    assert api.client.get("/metrics").status_code == 401
    assert api.get("/metrics", role="reader").status_code == 403
    assert api.get("/metrics", role="requester").status_code == 403
    for role in ("auditor", "admin"):
        scraped = api.get("/metrics", role=role)
        assert scraped.status_code == 200 and "lethe_http_requests_total" in scraped.text
        assert scraped.headers["content-type"].startswith("text/plain")


def test_metrics_token_mode(settings: Settings) -> None:
    with pytest.raises(ValidationError, match="LETHE_METRICS_TOKEN"):
        Settings(metrics_access="token")
    token = "scrape-" + uuid.uuid4().hex
    with metrics_app(settings, metrics_access="token", metrics_token=SecretStr(token)) as client:
        keys = make_keys(settings.resolved_database_url)
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer("wrong-token-0123456789")).status_code == 401
        assert client.get("/metrics", headers=bearer(keys["admin"])).status_code == 401
        scraped = client.get("/metrics", headers=bearer(token))
        assert scraped.status_code == 200 and "lethe_deletion_tasks_queued" in scraped.text


def test_metrics_public_and_off(settings: Settings) -> None:
    with metrics_app(settings, metrics_access="public") as client:
        assert client.get("/metrics").status_code == 200
    with metrics_app(settings, metrics_access="off") as client:
        keys = make_keys(settings.resolved_database_url)
        off = client.get("/metrics", headers=bearer(keys["admin"]))
        assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"


# ---- found by Schemathesis ---------------------------------------------------------------


def test_noise_too_small_to_square_is_refused(api: Api, digits: dict) -> None:
    """σ = 5e-324 passed σ > 0, then σ² underflowed to 0 and the preview divided by it (500)."""
    method = {"name": "noisy_finetune", "sigma": 5e-324}
    response = api.post(
        "/v1/models", json={"name": "m", "dataset_id": digits["id"], "method": method}
    )
    assert_invalid(response)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "m", "dataset_id": "DS"},  # a string is not an integer
        {"name": "m", "dataset_id": True},
        {"name": "m", "dataset_id": 1, "privacy": {"allow_heuristic": 0}},
        {"name": "m", "dataset_id": 1, "training": {"seed": False}},
        {"name": "m", "dataset_id": 1, "training": {"epochs": 2.0}},
    ],
)
def test_bodies_are_not_coerced(api: Api, body: dict) -> None:
    """The OpenAPI schema says integer/boolean: `"1"`, `true`, `0` or `2.0` are refused."""
    assert_invalid(api.post("/v1/models", json=body))


def test_405_names_every_method_of_the_path(api: Api) -> None:
    response = api.client.request("OPTIONS", "/v1/models", headers=api.h())
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    # /v1/models/import is not a model id: 405, not a 422 about the id
    response = api.client.get("/v1/models/import", headers=api.h())
    assert response.status_code == 405 and response.headers["allow"] == "POST"


@pytest.mark.parametrize("since", ["0.5", "1700000000", "yesterday", "2024-01-01"])
def test_since_is_a_date_time_only(api: Api, since: str) -> None:
    assert_invalid(api.get("/v1/audit/certificates", params={"since": since}))


def test_since_accepts_rfc3339(api: Api) -> None:
    for since in ("2024-01-31T12:00:00Z", "2024-01-31T12:00:00+02:00", "2024-01-31 12:00"):
        response = api.get("/v1/audit/certificates", params={"since": since})
        assert response.status_code == 200, response.text


def test_openapi_declares_errors_and_content_types(api: Api) -> None:
    paths = api.client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            if path.startswith("/v1/"):
                codes = set(operation["responses"])
                assert {"401", "403", "422", "503"} <= codes, (method, path, codes)
                error = operation["responses"]["503"]
                assert "Retry-After" in error["headers"]
                assert "application/json" in error["content"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    export = paths["/v1/audit/export"]["get"]["responses"]["200"]["content"]
    assert set(export) == {"application/x-ndjson"}
    for route in (
        "/v1/models/{model_id}/weights",
        "/v1/models/{model_id}/versions/{number}/weights",
    ):
        weights = paths[route]["get"]["responses"]  # 410: weights_erased, model_withdrawn
        assert set(weights["200"]["content"]) == {"application/octet-stream"}
        assert {"404", "409", "410"} <= set(weights), route


def test_empty_idempotency_key_is_refused(api: Api, digits: dict) -> None:
    """An empty Idempotency-Key was stored unscoped; the second such request hit the unique
    index on every retry (500)."""
    body = {"dataset_id": digits["id"], "sample_ids": ["0"]}
    for _ in range(2):
        response = api.post(
            "/v1/deletions", role="requester", json=body, headers={"Idempotency-Key": ""}
        )
        assert_invalid(response)
