"""What a worker's jobs work with, built once where the worker starts (the
embedded worker's thread or process, `lethe worker`) and passed to every job as its first
argument: the service's Runtime (settings, database, keyring, blob store) and the worker's
own parts (its resident sessions, its cache of opened samples, its announcer of finished
requests, its due lists). Nothing a job calls reads a process-wide configuration, so two
services in one process (tests, thread-mode embedded workers) share nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.core.db.session import Database
from app.core.dispatch import DueList
from app.core.runtime import Runtime
from app.core.settings import Settings
from app.core.storage.blobs import Blobs
from app.core.storage.crypto import Keyring
from app.core.wakeups import Announcer
from workers.data import OpenedSamples
from workers.device import worker_device
from workers.resident import Sessions


@dataclass
class JobContext:
    """A worker's resources; `device()` is resolved per job (a missing GPU fails the job
    before it claims any work, as LETHE_DEVICE promises)."""

    runtime: Runtime
    sessions: Sessions
    opened: OpenedSamples
    announcer: Announcer
    due: DueList | None  # distributed with LETHE_STICKY_SECONDS > 0: lingering on a lease

    @classmethod
    def build(cls, settings: Settings) -> JobContext:
        """A worker process's: a Runtime of its own (the embedded worker's process, `lethe
        worker`)."""
        return cls.of(Runtime.build(settings))

    @classmethod
    def of(cls, runtime: Runtime) -> JobContext:
        """A worker's parts around `runtime` (the thread-mode worker shares the API's)."""
        settings = runtime.settings
        lingers = not settings.embedded and settings.sticky_seconds > 0
        return cls(
            runtime=runtime,
            sessions=Sessions(settings.resident_models),
            opened=OpenedSamples(runtime.keyring),
            announcer=Announcer(settings.redis_url, settings.queue_name),
            due=DueList(str(settings.redis_url), settings.queue_name) if lingers else None,
        )

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    @property
    def db(self) -> Database:
        return self.runtime.db

    @property
    def blobs(self) -> Blobs:
        return self.runtime.blobs

    @property
    def keyring(self) -> Keyring:
        return self.runtime.keyring

    def resident_sessions(self) -> Sessions:
        """The sessions this worker keeps (a test stands two workers' caches in here)."""
        return self.sessions

    def device(self) -> torch.device:
        """Threads, and the device the job computes on (DeviceUnavailable before any work is
        claimed when LETHE_DEVICE=cuda finds no GPU)."""
        if self.settings.torch_threads > 0:
            torch.set_num_threads(self.settings.torch_threads)
        return worker_device(self.settings)
