"""`lethe worker`: an RQ SimpleWorker (no fork, so CUDA works), the reconciler, and the
worker's Prometheus metrics on LETHE_WORKER_METRICS_PORT. Imports no web framework."""

from __future__ import annotations

import logging
import threading

from app.dispatch import Reconciler, RQDispatcher, reconcile_and_signal
from app.settings import get_settings
from workers import metrics
from workers.lease import WORKER_ID, beat

log = logging.getLogger("lethe.worker")


def run(burst: bool = False) -> None:
    from rq import SimpleWorker

    settings = get_settings()
    if not settings.redis_url:
        raise SystemExit("lethe worker needs LETHE_REDIS_URL (embedded mode runs its own worker)")
    url = settings.resolved_database_url
    if settings.worker_metrics_port:
        metrics.serve(settings.worker_metrics_port)
    dispatcher = RQDispatcher(settings)
    beat(url, "rq")
    reconcile_and_signal(url, dispatcher)
    stop = threading.Event()
    reconciler = Reconciler(url, dispatcher, settings.reconcile_seconds)
    heart = threading.Thread(
        target=_heartbeat, args=(url, settings.heartbeat_seconds, stop), daemon=True
    )
    if not burst:
        reconciler.start()
        heart.start()
    worker = SimpleWorker(
        [dispatcher.queue], connection=dispatcher.redis, name=WORKER_ID.replace(":", "-")
    )
    log.info("worker %s listening on queue %r", WORKER_ID, settings.queue_name)
    try:
        worker.work(with_scheduler=True, burst=burst, logging_level="INFO")
    finally:
        stop.set()


def _heartbeat(url: str, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        try:
            beat(url, "rq")
        except Exception:
            log.warning("heartbeat failed", exc_info=True)
