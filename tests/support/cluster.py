"""Run Lethe as real local processes: one `lethe serve` and any number of `lethe worker`s.

Used by the distributed tests and by bench/pipeline.py. Embedded mode when redis_url is None.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from app.core.settings import Settings
from app.core.storage.crypto import Keyring, keyring

LETHE = [sys.executable, "-m", "app.launch"]  # `lethe`


_CHOOSER = random.SystemRandom()  # not the seeded `random`: each test process picks its own


def free_port() -> int:
    """A TCP port free on loopback now: in LETHE_TEST_PORTS ("20000-20999") where set, so
    a machine can confine the suite's servers, else below the kernel's ephemeral range. The
    kernel gives ports in that range to outgoing connections, so a server stopped and started
    again on its ports could find one taken by any client's connection meanwhile (a SeaweedFS
    restarted in the suite did); below it only another such choice can take one."""
    confined = confined_ports()
    if confined is not None:
        port = _free_in(confined[0], confined[1] + 1, 200)
        if port is None:
            raise RuntimeError(f"no free port in LETHE_TEST_PORTS={os.environ['LETHE_TEST_PORTS']}")
        return port
    low = _ephemeral_low()
    if low - 1024 >= 4096:
        port = _free_in(max(1024, low - 16384), low, 100)
        if port is not None:
            return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_in(low: int, high: int, tries: int) -> int | None:
    """A port in [low, high) that binds on loopback now, drawn at random (None: none found)."""
    for _ in range(tries):
        port = _CHOOSER.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return None


def confined_ports() -> tuple[int, int] | None:
    """LETHE_TEST_PORTS as (first, last), or None where unset; ValueError if malformed."""
    given = os.environ.get("LETHE_TEST_PORTS", "").strip()
    if not given:
        return None
    first, _, last = given.partition("-")
    low, high = int(first), int(last or first)
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"LETHE_TEST_PORTS={given!r}: want FIRST-LAST within 1024-65535")
    return low, high


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _answers(url: str) -> bool:
    """uvicorn logs "startup complete" before it binds: wait until /healthz answers."""
    return answers(f"{url}/healthz")


def answers(url: str) -> bool:
    """Whether a GET of `url` answers 200 now."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(url: str, timeout: float = 30.0) -> None:
    """Wait until a GET of `url` answers 200 (a server started as a process)."""
    deadline = time.monotonic() + timeout
    while not answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.1)


class Cluster:
    def __init__(
        self, data_dir: Path, database_url: str | None, redis_url: str | None, **settings: object
    ) -> None:
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.queue = f"lethe-{uuid.uuid4().hex[:8]}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LETHE_") or k.startswith("LETHE_TEST")
        }
        env.update({"LETHE_DATA_DIR": str(data_dir), "LETHE_QUEUE_NAME": self.queue})
        if database_url:
            env["LETHE_DATABASE_URL"] = database_url
        if redis_url:
            env["LETHE_REDIS_URL"] = redis_url
        for name, value in settings.items():  # pydantic-settings reads lists as JSON
            env[f"LETHE_{name.upper()}"] = (
                json.dumps(value) if isinstance(value, list) else str(value)
            )
        self.env = env
        self.api: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.url = ""
        self.admin_key = ""

    def start_api(self) -> str:
        port = free_port()
        log = self.data_dir / "api.log"
        with log.open("w") as fh:
            self.api = subprocess.Popen(
                [*LETHE, "serve", "--port", str(port)], stdout=fh, stderr=fh, env=self.env
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log.read_text()
            if "Application startup complete" in text and _answers(f"http://127.0.0.1:{port}"):
                match = re.search(r"lethe_adm_[A-Za-z0-9_-]+", text)
                self.admin_key = match.group(0) if match else self.admin_key
                self.url = f"http://127.0.0.1:{port}"
                return self.url
            if self.api.poll() is not None:
                raise RuntimeError(f"api exited:\n{text}")
            time.sleep(0.1)
        raise RuntimeError(f"api did not start:\n{log.read_text()}")

    def start_worker(self) -> subprocess.Popen:
        log = (self.data_dir / f"worker-{len(self.workers)}.log").open("w")
        # Own session: RQ forks its scheduler as a child; stopping the group stops both.
        proc = subprocess.Popen(
            [*LETHE, "worker"], stdout=log, stderr=log, env=self.env, start_new_session=True
        )
        self.workers.append(proc)
        return proc

    def worker_by_pid(self, pid: int) -> subprocess.Popen:
        return next(w for w in self.workers if w.pid == pid)

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        """Signal a worker's whole process group (the worker and its RQ scheduler)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    @property
    def keyring(self) -> Keyring:
        """The cluster's keyring (its processes share `<data_dir>/master.key`): tests compute
        the tokens the database stores for ids."""
        return keyring(Settings(data_dir=self.data_dir))

    def client(self, key: str | None = None, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {key or self.admin_key}"},
        )

    def new_key(self, role: str) -> str:
        with self.client() as c:
            response = c.post("/v1/keys", json={"role": role})
            response.raise_for_status()
            return response.json()["key"]

    def stop(self) -> None:
        if self.api and self.api.poll() is None:
            self.api.terminate()
        for proc in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.workers, *([self.api] if self.api else [])]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for proc in self.workers:  # the scheduler child may outlive its parent
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
