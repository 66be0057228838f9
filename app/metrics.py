"""Prometheus metrics of the API process: HTTP traffic, and queue and worker gauges read from
the database at scrape time (a read-only unit of work: a scrape never takes a write lock).
The workers' own counters are in workers/metrics.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.db.session import database
from app.core.db.tables import WorkerHeartbeat
from app.core.services.queue import queue_stats

HTTP_REQUESTS = Counter("lethe_http_requests_total", "HTTP requests", ["method", "route", "status"])
HTTP_LATENCY = Histogram(
    "lethe_http_request_duration_seconds", "HTTP request latency", ["method", "route"]
)


class MetricsMiddleware:
    """Counts requests by route and status and times them: a pure ASGI middleware (Starlette's
    BaseHTTPMiddleware cost a tenth of the request path's time under load)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception that escapes every handler is what the client sees

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            HTTP_REQUESTS.labels(scope["method"], route, str(status)).inc()
            HTTP_LATENCY.labels(scope["method"], route).observe(time.perf_counter() - start)


class PipelineCollector:
    """Queue depth, age of the oldest queued request, worker heartbeat ages, at scrape time."""

    def __init__(self, url: str, queue_depth: Callable[[], int]) -> None:
        self.url, self.queue_depth = url, queue_depth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with database(self.url).read() as session:
            stats = queue_stats(session)
            workers = session.execute(
                select(WorkerHeartbeat.id, WorkerHeartbeat.mode, WorkerHeartbeat.heartbeat_at)
            ).all()
        yield GaugeMetricFamily(
            "lethe_deletion_tasks_queued", "Per-model deletion tasks waiting", value=stats["queued"]
        )
        yield GaugeMetricFamily(
            "lethe_oldest_queued_age_seconds",
            "Age of the oldest queued deletion task",
            value=stats["oldest_age_seconds"],
        )
        yield GaugeMetricFamily(
            "lethe_queue_signals",
            "Signals waiting in the job queue",
            value=float(self.queue_depth()),
        )
        beat = GaugeMetricFamily(
            "lethe_worker_heartbeat_timestamp_seconds",
            "Last heartbeat of each worker",
            labels=["worker", "mode"],
        )
        for worker_id, mode, at in workers:
            beat.add_metric([worker_id, mode], at.timestamp())
        yield beat


def pipeline_registry(url: str, queue_depth: Callable[[], int]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PipelineCollector(url, queue_depth))
    return registry
