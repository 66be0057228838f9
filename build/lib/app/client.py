"""A small HTTP client for the CLI and scripts (httpx), raising on JSON errors."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from app.states import FINISHED_REQUEST, ModelStatus


class LetheError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{status} {err.get('code', '')}: {err.get('message', body)}")
        self.status, self.body = status, body


class Client:
    def __init__(
        self, url: str | None = None, key: str | None = None, timeout: float = 60.0
    ) -> None:
        self.url = (url or os.environ.get("LETHE_URL", "http://127.0.0.1:8000")).rstrip("/")
        self.key = key or os.environ.get("LETHE_API_KEY", "")
        self.http = httpx.Client(
            base_url=self.url, timeout=timeout, headers={"Authorization": f"Bearer {self.key}"}
        )

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        response = self.http.request(method, path, **kw)
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = response.text
            raise LetheError(response.status_code, body)
        return response

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw).json()

    def wait_model(self, model_id: int, on_progress: Any = None, timeout: float = 3600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.get(f"/v1/models/{model_id}")
            if on_progress:
                on_progress(model)
            if model["status"] in (ModelStatus.ready, ModelStatus.failed):
                return model
            time.sleep(0.3)
        raise TimeoutError(f"model {model_id} not ready after {timeout}s")

    def wait_deletion(
        self, request_id: int, timeout: float = 3600, on_progress: Any = None, poll: float = 20.0
    ) -> dict:
        """Long-poll until the request is done or failed; `on_progress(request)` sees each
        answer (every `poll` seconds at most), with its per-model progress."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            read_timeout = self.http.timeout.read or 60.0
            left = max(0.0, min(poll, read_timeout - 1.0, deadline - time.monotonic()))
            req = self.get(f"/v1/deletions/{request_id}", params={"wait": left})  # long poll
            if on_progress:
                on_progress(req)
            if req["status"] in FINISHED_REQUEST:
                return req
        raise TimeoutError(f"deletion {request_id} not finished after {timeout}s")
