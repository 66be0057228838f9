"""Servers the tests start for themselves: nobody else's data is ever touched."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
