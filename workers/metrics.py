"""The workers' Prometheus counters. In embedded mode they live in the API process and appear
on its /metrics; a `lethe worker` serves them on its own port (LETHE_WORKER_METRICS_PORT)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

DELETIONS_PROCESSED = Counter(
    "lethe_deletions_processed_total", "Deletion requests applied to a model", ["method"]
)
JOB_DURATION = Histogram(
    "lethe_job_duration_seconds",
    "Worker job duration",
    ["job"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
)
FALLBACKS = Counter(
    "lethe_exact_fallbacks_total",
    "Updates that retrained exactly instead of the configured method",
    ["method"],
)

DEADLINES_MISSED = Counter(
    "lethe_publication_deadline_missed_total",
    "Updates published after their constant-time deadline (publish_after_seconds): their "
    "time to publication may tell which branch ran",
)

ROWS_LEARNED = Counter(
    "lethe_rows_learned_total",
    "Appended rows models learned, by the method that released the learned version",
    ["method"],
)
VERSIONS_LEARNED = Counter(
    "lethe_versions_learned_total", "Learned versions released (rows appended)", ["method"]
)

STORAGE_FAULTS = Counter(
    "lethe_storage_faults_total",
    "Jobs put back to wait for storage (a full disk, an I/O error, an object store outage)",
    ["job"],
)

SESSIONS_WARMED = Counter(
    "lethe_sessions_warmed_total",
    "Resident sessions a worker made ahead of an update, after its predecessor gave way",
)

RESIDENT_STATES_HANDED_OVER = Counter(
    "lethe_resident_states_handed_over_total",
    "Resident method states (convex_head's anchored Hessians) a worker took over from the "
    "process it replaced instead of preparing them anew (workers/handover.py)",
)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose this process's metrics on http://host:port/metrics (a daemon thread)."""
    start_http_server(port, addr=host)


SHARD_TASKS = Counter(
    "lethe_shard_tasks_total",
    "A sharded model's shard tasks computed, by where: the update's own worker (here) or a "
    "helper job on another (helper)",
    ["where"],
)
