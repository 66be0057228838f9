"""Prometheus metrics of the API process: HTTP traffic, and queue and worker gauges read from
the database at scrape time (a read-only unit of work: a scrape never takes a write lock).
The workers' own counters are in workers/metrics.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import select
from starlette.requests import Request
from starlette.responses import Response

from app.db.session import database
from app.db.tables import WorkerHeartbeat
from app.services.queue import queue_stats

HTTP_REQUESTS = Counter("lethe_http_requests_total", "HTTP requests", ["method", "route", "status"])
HTTP_LATENCY = Histogram(
    "lethe_http_request_duration_seconds", "HTTP request latency", ["method", "route"]
)


async def metrics_middleware(request: Request, call_next: Callable) -> Response:
    start = time.perf_counter()
    response = await call_next(request)
    route = getattr(request.scope.get("route"), "path", "unmatched")
    HTTP_REQUESTS.labels(request.method, route, str(response.status_code)).inc()
    HTTP_LATENCY.labels(request.method, route).observe(time.perf_counter() - start)
    return response


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
