"""The app factory and its lifespan: migrations, first admin key, embedded worker, maintenance."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError

from app import accesslog
from app.api import (
    audit,
    audits,
    datasets,
    deletions,
    docs,
    formats,
    health,
    keys,
    mlflow,
    models,
    privacy,
    schemas,
    suppressions,
    ui,
    webhooks,
)
from app.api import log as public_log
from app.api.errors import DependencyGuard, install_error_handlers
from app.api.keycache import KeyCache
from app.api.limits import IngressLimitMiddleware
from app.api.restore_gate import RestoreGate, RestoreGateMiddleware
from app.api.scrub import ScrubMiddleware
from app.core import tracing
from app.core.db.group_commit import GroupCommitter
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.dispatch import InlineDispatcher, make_dispatcher
from app.core.maintenance import Maintenance, maintenance_tasks
from app.core.mlflow_export.sync import Syncer
from app.core.runtime import Runtime
from app.core.security import Role, create_key, has_any_key
from app.core.services.deletions import backfill_suppressions
from app.core.services.isolated import UploadPool, scrub_freed
from app.core.services.weights_cache import WeightsCache
from app.core.settings import Settings, get_settings
from app.core.storage.erasure import compact_at_start, finish_compacting
from app.core.wakeups import FINISHED, Listener
from app.core.webhooks.sender import Sender, report_here
from app.core.worker_process import ProcessDispatcher
from app.metrics import MetricsMiddleware, pipeline_registry

log = logging.getLogger("lethe")


def bootstrap_admin_key(url: str) -> str | None:
    """On first start create an admin key; returns the secret (shown once) or None."""
    with database(url).write() as session:
        if has_any_key(session):
            return None
        _, raw = create_key(session, Role.admin, "bootstrap admin")
        return raw


@asynccontextmanager
async def _lifespan(runtime: Runtime, app: FastAPI) -> AsyncIterator[None]:
    """Start: migrations and the first compaction (embedded), the first admin key, the fork
    server, the worker and the maintenance tasks (none while a restore is due); stop: all of
    it in reverse, the last checkpoint published and every connection closed."""
    settings = runtime.settings
    _prepare(runtime)
    app.state.uploads.warm_up()  # the fork server uploads are parsed from (services/isolated.py)
    scrub_freed()  # freed request buffers overwritten
    dispatcher = app.state.dispatcher
    maintenance, listener = None, None
    # no worker while behind: it would sign a second tree at a published size
    behind = _restored_from_backup(app.state.restore_gate)
    if not behind:
        _backfill(runtime)
    embedded = isinstance(dispatcher, InlineDispatcher | ProcessDispatcher)
    if embedded and not behind:
        dispatcher.start()
        FINISHED.dependable = True  # the embedded worker wakes the waiters itself
        maintenance = Maintenance(maintenance_tasks(runtime, dispatcher))
        maintenance.start()
    elif settings.redis_url and not behind:  # workers announce finished requests on Redis
        listener = Listener(settings.redis_url, settings.queue_name)
        listener.start()
    # webhooks are sent beside the worker, off the request path: here only when the worker is
    # a thread of this process (the embedded worker process and `lethe worker` send their own)
    sends_here = isinstance(dispatcher, InlineDispatcher) and not behind
    sender = Sender(runtime.db, runtime.keyring, settings) if sends_here else None
    report_here(sends_here or behind)
    if sender is not None:
        sender.start()
    syncer = _mlflow_syncer(runtime, start=not behind)  # published versions to MLflow
    yield
    if syncer is not None:
        syncer.stop()
    if sender is not None:
        sender.stop()
    app.state.committer.stop()
    FINISHED.dependable = False
    if listener is not None:
        listener.stop()
    if maintenance is not None:
        maintenance.stop()
    if embedded and not behind:
        dispatcher.stop()
    runtime.publisher.finish()
    app.state.uploads.shut_down()  # the pool's idle workers, and with them the fork server
    finish_compacting(runtime.db)
    runtime.db.dispose()  # the last SQLite connection to close removes the WAL


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API of one service: its Runtime is built here and passed in, so two
    apps in one process (tests, a thread-mode embedded worker each) share nothing."""
    settings = settings or get_settings()
    tracing.configure(
        "lethe-api", settings.trace_sql
    )  # before the engines: their statements become spans
    runtime = Runtime.build(settings)
    accesslog.install()
    url = settings.resolved_database_url

    app = FastAPI(
        title="Lethe",
        version="0.1.0",
        lifespan=partial(_lifespan, runtime),
        docs_url=None,  # app/api/docs.py serves Swagger UI without a CDN
        redoc_url=None,  # so is ReDoc, at /redoc
        description="Certified machine unlearning: deletion requests in, "
        "unlearned models and (ε, δ) certificates out.",
    )
    app.state.runtime = runtime
    app.state.db = runtime.db
    app.state.key_cache = KeyCache(runtime.db, settings.key_cache_seconds)
    app.state.committer = GroupCommitter.for_database(app.state.db)
    app.state.weights_cache = WeightsCache(settings.weights_cache_bytes)
    app.state.dispatcher = make_dispatcher(runtime)
    app.state.pipeline_registry = pipeline_registry(url, app.state.dispatcher.depth)
    app.state.uploads = UploadPool()  # started on the first upload (or its warm-up)
    app.state.restore_gate = RestoreGate(app.state.db, settings.resolved_journal_dir)
    install_error_handlers(app)
    _install_middleware(app, settings)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/ui/static", ui.static_files(), name="ui-static")
    app.mount("/docs/static", docs.static_files(), name="docs-static")
    return app


ROUTERS = (
    health.router,
    datasets.router,
    formats.router,
    models.router,
    deletions.router,
    audit.router,
    audits.router,
    public_log.router,
    keys.router,
    privacy.router,
    schemas.router,
    suppressions.router,
    webhooks.router,
    mlflow.router,
    ui.router,
    docs.router,
)


def _install_middleware(app: FastAPI, settings: Settings) -> None:
    """The middleware, innermost first: ingress limits, scrubbing, the restore gate, the
    dependency guard, metrics, and the tracing that wraps them all."""
    # Inside the metrics middleware (its 401s and 413s are counted), outside the routes.
    app.add_middleware(
        IngressLimitMiddleware,
        max_json_bytes=settings.max_json_bytes,
        max_upload_bytes=settings.max_upload_bytes,
    )
    app.add_middleware(ScrubMiddleware)  # an upload's or a deletion's raw body, wiped after
    app.add_middleware(RestoreGateMiddleware, gate=app.state.restore_gate)
    app.add_middleware(DependencyGuard)  # 503, not 500, when the ingress check finds no database
    app.add_middleware(MetricsMiddleware)
    tracing.instrument_app(app)  # outermost: a request's server span covers all of it


def _prepare(runtime: Runtime) -> None:
    """Before anything runs: an embedded database migrated, compacted and its blobs moved to
    the configured store; the first admin key printed once; a warning where the restore
    journal would be backed up with the database."""
    settings, url = runtime.settings, runtime.settings.resolved_database_url
    if settings.embedded:
        upgrade_to_head(url, settings)
        compact_at_start(runtime.db, settings)  # keys a stopped process destroyed
        moved = runtime.blobs.migrate()  # blobs of an older database leave it
        if moved:
            log.info("moved %d blobs into the %s store", moved, settings.blob_store)
    if settings.bootstrap_admin_key and (raw := bootstrap_admin_key(url)):
        print(
            f"\n  Lethe admin API key (shown once, store it now):\n\n    {raw}\n",
            file=sys.stderr,
            flush=True,
        )
    if settings.journal_in_data_dir:
        log.warning(
            "the restore journal (%s) is inside the data folder: a backup of the folder "
            "restores it with the database, and a rollback goes unnoticed; set "
            "LETHE_JOURNAL_DIR elsewhere (docs/operations/backups.md)",
            settings.resolved_journal_dir,
        )


def _mlflow_syncer(runtime: Runtime, start: bool) -> Syncer | None:
    """The thread that copies every published version to MLflow, where one is configured
    (its client checked whether or not it starts now)."""
    settings = runtime.settings
    if not settings.mlflow_tracking_uri:
        return None
    if importlib.util.find_spec("mlflow") is None:
        raise RuntimeError(
            "LETHE_MLFLOW_TRACKING_URI is set but MLflow's client is not installed: "
            "pip install 'lethe-unlearning[mlflow]' (mlflow-skinny)"
        )
    if not start:
        return None
    syncer = Syncer(runtime.db, runtime.blobs, settings)
    syncer.start()
    return syncer


def _backfill(runtime: Runtime) -> None:
    """The sample ids of rows accepted for erasure before subject erasures listed them, on
    the suppression list; a database that cannot be read now is backfilled at the next start."""
    try:
        if backfill_suppressions(runtime.db, runtime.keyring):
            log.info("sample ids of rows being erased put on the suppression list")
    except DBAPIError:
        log.warning("the suppression list's backfill waits for the database", exc_info=True)


def _restored_from_backup(gate: RestoreGate) -> bool:
    """Whether the database is behind the restore journal; a database that cannot be read
    now is checked again on the first request."""
    try:
        return gate.check().state == "behind"
    except Exception:  # noqa: BLE001 - readiness reports the database; the gate retries
        log.warning("could not compare the database with the restore journal", exc_info=True)
        return False
