"""Lethe's Python client, sync (`Client`) and async (`AsyncClient`), on httpx.

Every endpoint is a typed method that returns the API's own pydantic models (or a plain dict
where the API's answer is open-ended: certificates, the preview, the audit check); every
error is a `LetheError` subclass carrying the API's `code`, `message` and `details`. Each
endpoint is described once, as a `Call` (`_calls`); the two clients only send it.

    from app.client import Client
    c = Client("http://127.0.0.1:8000", "lethe_adm_...")
    model = c.wait_model(c.create_model({"name": "m", "dataset_id": 1}).id, on_progress=print)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from app.schemas import (
    DatasetOut,
    DeletionOut,
    DeletionPage,
    KeyOut,
    ModelOut,
    SamplePage,
    VersionOut,
)
from app.states import FINISHED_REQUEST, ModelStatus

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
DEFAULT_URL = "http://127.0.0.1:8000"


# ---- errors -------------------------------------------------------------------------------


class LetheError(RuntimeError):
    """An error answer: the HTTP status and the API's code, message and details."""

    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        self.status, self.body = status, body
        self.code: str = err.get("code", "") if isinstance(err, dict) else ""
        self.message: str = err.get("message", str(body)) if isinstance(err, dict) else str(body)
        self.details: Any = err.get("details") if isinstance(err, dict) else None
        super().__init__(f"{status} {self.code}: {self.message}")


class Unauthorized(LetheError):
    """401: no key, or an unknown or revoked one."""


class Forbidden(LetheError):
    """403: the key's role may not do this."""


class NotFound(LetheError):
    """404: an unknown id."""


class Conflict(LetheError):
    """409: conflicts with the current state (e.g. a model still training)."""


class Gone(LetheError):
    """410: erased (purged weights)."""


class TooLarge(LetheError):
    """413: a body or dataset over the limits."""


class UnsupportedMediaType(LetheError):
    """415: the wrong content type."""


class Invalid(LetheError):
    """422: invalid input; `details` says where."""


class Unavailable(LetheError):
    """503: the database or the queue is down; retry after `retry_after` seconds."""


ERRORS: dict[int, type[LetheError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: TooLarge,
    415: UnsupportedMediaType,
    422: Invalid,
    503: Unavailable,
}


def error_for(response: httpx.Response) -> LetheError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return ERRORS.get(response.status_code, LetheError)(response.status_code, body)


# ---- the endpoints, described once ----------------------------------------------------------


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _json(response: httpx.Response) -> Any:
    return response.json()


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: cls.model_validate(response.json())


def _models(cls: type[M]) -> Callable[[httpx.Response], list[M]]:
    return lambda response: [cls.model_validate(item) for item in response.json()]


def _bytes(response: httpx.Response) -> bytes:
    return response.content


def _none(response: httpx.Response) -> None:
    return None


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class _calls:  # noqa: N801 - a namespace of Call builders
    @staticmethod
    def health() -> Call[Any]:
        return Call("GET", "/healthz", _json)

    @staticmethod
    def me() -> Call[KeyOut]:
        return Call("GET", "/v1/keys/me", _model(KeyOut))

    @staticmethod
    def register_builtin(builtin: str, **options: Any) -> Call[DatasetOut]:
        return Call(
            "POST", "/v1/datasets", _model(DatasetOut), {"json": {"builtin": builtin, **options}}
        )

    @staticmethod
    def upload_dataset(path: Path, fmt: str | None, fields: dict[str, Any]) -> Call[DatasetOut]:
        data = {k: str(v) for k, v in fields.items() if v is not None}
        if fmt:
            data["format"] = fmt
        files = {"file": (path.name, path.read_bytes())}
        return Call("POST", "/v1/datasets", _model(DatasetOut), {"files": files, "data": data})

    @staticmethod
    def dataset(dataset_id: int) -> Call[DatasetOut]:
        return Call("GET", f"/v1/datasets/{dataset_id}", _model(DatasetOut))

    @staticmethod
    def samples(
        dataset_id: int, split: str | None, status: str | None, offset: int, limit: int
    ) -> Call[SamplePage]:
        params = _params(split=split, status=status, offset=offset, limit=limit)
        return Call(
            "GET", f"/v1/datasets/{dataset_id}/samples", _model(SamplePage), {"params": params}
        )

    @staticmethod
    def create_model(spec: dict[str, Any]) -> Call[ModelOut]:
        return Call("POST", "/v1/models", _model(ModelOut), {"json": spec})

    @staticmethod
    def models() -> Call[list[ModelOut]]:
        return Call("GET", "/v1/models", _models(ModelOut))

    @staticmethod
    def model(model_id: int) -> Call[ModelOut]:
        return Call("GET", f"/v1/models/{model_id}", _model(ModelOut))

    @staticmethod
    def versions(model_id: int) -> Call[list[VersionOut]]:
        return Call("GET", f"/v1/models/{model_id}/versions", _models(VersionOut))

    @staticmethod
    def version(model_id: int, number: int) -> Call[VersionOut]:
        return Call("GET", f"/v1/models/{model_id}/versions/{number}", _model(VersionOut))

    @staticmethod
    def weights(model_id: int, number: int | None) -> Call[bytes]:
        path = f"/v1/models/{model_id}" + (f"/versions/{number}" if number else "") + "/weights"
        return Call("GET", path, _bytes)

    @staticmethod
    def delete(body: dict[str, Any], idempotency_key: str | None) -> Call[DeletionOut]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return Call(
            "POST", "/v1/deletions", _model(DeletionOut), {"json": body, "headers": headers}
        )

    @staticmethod
    def deletion(request_id: int, wait: float) -> Call[DeletionOut]:
        params = {"wait": wait} if wait else {}
        return Call("GET", f"/v1/deletions/{request_id}", _model(DeletionOut), {"params": params})

    @staticmethod
    def deletions(offset: int, limit: int) -> Call[DeletionPage]:
        params = {"offset": offset, "limit": limit}
        return Call("GET", "/v1/deletions", _model(DeletionPage), {"params": params})

    @staticmethod
    def certificates(
        model: int | None, subject: str | None, since: str | None, offset: int, limit: int
    ) -> Call[list[dict[str, Any]]]:
        params = _params(model=model, subject=subject, since=since, offset=offset, limit=limit)
        return Call(
            "GET", "/v1/audit/certificates", lambda r: r.json()["items"], {"params": params}
        )

    @staticmethod
    def certificate(certificate_id: int) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/audit/certificates/{certificate_id}", _json)

    @staticmethod
    def verify() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/audit/verify", _json)

    @staticmethod
    def export() -> Call[bytes]:
        return Call("GET", "/v1/audit/export", _bytes)

    @staticmethod
    def preview(model: int, epsilon: float | None, delta: float | None) -> Call[dict[str, Any]]:
        params = _params(model=model, epsilon=epsilon, delta=delta)
        return Call("GET", "/v1/privacy/preview", _json, {"params": params})

    @staticmethod
    def create_key(role: str, name: str) -> Call[KeyOut]:
        return Call("POST", "/v1/keys", _model(KeyOut), {"json": {"role": role, "name": name}})

    @staticmethod
    def revoke_key(key_id: int) -> Call[None]:
        return Call("DELETE", f"/v1/keys/{key_id}", _none)


def _deletion_body(
    dataset_id: int,
    sample_ids: list[str] | None,
    subject_ids: list[str] | None,
    method: str | None,
    epsilon: float | None,
    delta: float | None,
) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "sample_ids": sample_ids or [],
        "subject_ids": subject_ids or [],
        **_params(method=method, epsilon=epsilon, delta=delta),
    }


def _settings(url: str | None, key: str | None) -> tuple[str, str]:
    return (
        (url or os.environ.get("LETHE_URL", DEFAULT_URL)).rstrip("/"),
        key or os.environ.get("LETHE_API_KEY", ""),
    )


# ---- sync -----------------------------------------------------------------------------------


class Client:
    """The sync client. `url` and `key` default to LETHE_URL and LETHE_API_KEY."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        timeout: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.url, self.key = _settings(url, key)
        self.http = http or httpx.Client(base_url=self.url, timeout=timeout)
        self.http.headers["Authorization"] = f"Bearer {self.key}"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def send(self, call: Call[T]) -> T:
        response = self.http.request(call.method, call.path, **call.kwargs)
        if response.status_code >= 400:
            raise error_for(response)
        return call.parse(response)

    # Untyped access to any path (JSON in, JSON out), for scripts and the benches.
    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        response = self.http.request(method, path, **kw)
        if response.status_code >= 400:
            raise error_for(response)
        return response

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw).json()

    # Typed endpoints.
    def health(self) -> dict[str, Any]:
        return self.send(_calls.health())

    def me(self) -> KeyOut:
        return self.send(_calls.me())

    def register_builtin(self, builtin: str, **options: Any) -> DatasetOut:
        return self.send(_calls.register_builtin(builtin, **options))

    def upload_dataset(self, path: str | Path, fmt: str | None = None, **fields: Any) -> DatasetOut:
        return self.send(_calls.upload_dataset(Path(path), fmt, fields))

    def dataset(self, dataset_id: int) -> DatasetOut:
        return self.send(_calls.dataset(dataset_id))

    def samples(
        self,
        dataset_id: int,
        split: str | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> SamplePage:
        return self.send(_calls.samples(dataset_id, split, status, offset, limit))

    def create_model(self, spec: dict[str, Any]) -> ModelOut:
        return self.send(_calls.create_model(spec))

    def models(self) -> list[ModelOut]:
        return self.send(_calls.models())

    def model(self, model_id: int) -> ModelOut:
        return self.send(_calls.model(model_id))

    def versions(self, model_id: int) -> list[VersionOut]:
        return self.send(_calls.versions(model_id))

    def version(self, model_id: int, number: int) -> VersionOut:
        return self.send(_calls.version(model_id, number))

    def weights(self, model_id: int, number: int | None = None) -> bytes:
        return self.send(_calls.weights(model_id, number))

    def delete(
        self,
        dataset_id: int,
        sample_ids: list[str] | None = None,
        subject_ids: list[str] | None = None,
        *,
        method: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        idempotency_key: str | None = None,
    ) -> DeletionOut:
        body = _deletion_body(dataset_id, sample_ids, subject_ids, method, epsilon, delta)
        return self.send(_calls.delete(body, idempotency_key))

    def deletion(self, request_id: int, wait: float = 0) -> DeletionOut:
        return self.send(_calls.deletion(request_id, wait))

    def deletions(self, offset: int = 0, limit: int = 100) -> DeletionPage:
        return self.send(_calls.deletions(offset, limit))

    def certificates(
        self,
        model: int | None = None,
        subject: str | None = None,
        since: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        return self.send(_calls.certificates(model, subject, since, offset, limit))

    def certificate(self, certificate_id: int) -> dict[str, Any]:
        return self.send(_calls.certificate(certificate_id))

    def verify(self) -> dict[str, Any]:
        return self.send(_calls.verify())

    def export(self) -> bytes:
        return self.send(_calls.export())

    def preview(
        self, model: int, epsilon: float | None = None, delta: float | None = None
    ) -> dict[str, Any]:
        return self.send(_calls.preview(model, epsilon, delta))

    def create_key(self, role: str, name: str = "api key") -> KeyOut:
        return self.send(_calls.create_key(role, name))

    def revoke_key(self, key_id: int) -> None:
        self.send(_calls.revoke_key(key_id))

    # Waiting, with progress.
    def wait_model(
        self, model_id: int, on_progress: Callable[[Any], None] | None = None, timeout: float = 3600
    ) -> dict[str, Any]:
        """Poll until the model is ready or failed; `on_progress(model)` sees each poll (the
        model as a dict, with `progress: {stage, epoch, epochs}`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = self.get(f"/v1/models/{model_id}")
            if on_progress:
                on_progress(model)
            if model["status"] in (ModelStatus.ready, ModelStatus.failed):
                return dict(model)
            time.sleep(0.3)
        raise TimeoutError(f"model {model_id} not ready after {timeout}s")

    def wait_deletion(
        self,
        request_id: int,
        timeout: float = 3600,
        on_progress: Callable[[Any], None] | None = None,
        poll: float = 20.0,
    ) -> dict[str, Any]:
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
                return dict(req)
        raise TimeoutError(f"deletion {request_id} not finished after {timeout}s")


# ---- async ----------------------------------------------------------------------------------


class AsyncClient:
    """The same endpoints, awaited (`async with AsyncClient(url, key) as c: ...`)."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.url, self.key = _settings(url, key)
        self.http = http or httpx.AsyncClient(base_url=self.url, timeout=timeout)
        self.http.headers["Authorization"] = f"Bearer {self.key}"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def send(self, call: Call[T]) -> T:
        response = await self.http.request(call.method, call.path, **call.kwargs)
        if response.status_code >= 400:
            raise error_for(response)
        return call.parse(response)

    async def health(self) -> dict[str, Any]:
        return await self.send(_calls.health())

    async def me(self) -> KeyOut:
        return await self.send(_calls.me())

    async def register_builtin(self, builtin: str, **options: Any) -> DatasetOut:
        return await self.send(_calls.register_builtin(builtin, **options))

    async def upload_dataset(
        self, path: str | Path, fmt: str | None = None, **fields: Any
    ) -> DatasetOut:
        return await self.send(_calls.upload_dataset(Path(path), fmt, fields))

    async def dataset(self, dataset_id: int) -> DatasetOut:
        return await self.send(_calls.dataset(dataset_id))

    async def samples(
        self,
        dataset_id: int,
        split: str | None = None,
        status: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> SamplePage:
        return await self.send(_calls.samples(dataset_id, split, status, offset, limit))

    async def create_model(self, spec: dict[str, Any]) -> ModelOut:
        return await self.send(_calls.create_model(spec))

    async def models(self) -> list[ModelOut]:
        return await self.send(_calls.models())

    async def model(self, model_id: int) -> ModelOut:
        return await self.send(_calls.model(model_id))

    async def versions(self, model_id: int) -> list[VersionOut]:
        return await self.send(_calls.versions(model_id))

    async def version(self, model_id: int, number: int) -> VersionOut:
        return await self.send(_calls.version(model_id, number))

    async def weights(self, model_id: int, number: int | None = None) -> bytes:
        return await self.send(_calls.weights(model_id, number))

    async def delete(
        self,
        dataset_id: int,
        sample_ids: list[str] | None = None,
        subject_ids: list[str] | None = None,
        *,
        method: str | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        idempotency_key: str | None = None,
    ) -> DeletionOut:
        body = _deletion_body(dataset_id, sample_ids, subject_ids, method, epsilon, delta)
        return await self.send(_calls.delete(body, idempotency_key))

    async def deletion(self, request_id: int, wait: float = 0) -> DeletionOut:
        return await self.send(_calls.deletion(request_id, wait))

    async def deletions(self, offset: int = 0, limit: int = 100) -> DeletionPage:
        return await self.send(_calls.deletions(offset, limit))

    async def certificates(
        self,
        model: int | None = None,
        subject: str | None = None,
        since: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        return await self.send(_calls.certificates(model, subject, since, offset, limit))

    async def certificate(self, certificate_id: int) -> dict[str, Any]:
        return await self.send(_calls.certificate(certificate_id))

    async def verify(self) -> dict[str, Any]:
        return await self.send(_calls.verify())

    async def export(self) -> bytes:
        return await self.send(_calls.export())

    async def preview(
        self, model: int, epsilon: float | None = None, delta: float | None = None
    ) -> dict[str, Any]:
        return await self.send(_calls.preview(model, epsilon, delta))

    async def create_key(self, role: str, name: str = "api key") -> KeyOut:
        return await self.send(_calls.create_key(role, name))

    async def revoke_key(self, key_id: int) -> None:
        await self.send(_calls.revoke_key(key_id))

    async def wait_model(
        self,
        model_id: int,
        on_progress: Callable[[ModelOut], None] | None = None,
        timeout: float = 3600,
    ) -> ModelOut:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            model = await self.model(model_id)
            if on_progress:
                on_progress(model)
            if model.status in (ModelStatus.ready, ModelStatus.failed):
                return model
            await asyncio.sleep(0.3)
        raise TimeoutError(f"model {model_id} not ready after {timeout}s")

    async def wait_deletion(
        self,
        request_id: int,
        on_progress: Callable[[DeletionOut], None] | None = None,
        timeout: float = 3600,
        poll: float = 20.0,
    ) -> DeletionOut:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            read_timeout = self.http.timeout.read or 60.0
            left = max(0.0, min(poll, read_timeout - 1.0, deadline - time.monotonic()))
            req = await self.deletion(request_id, wait=left)
            if on_progress:
                on_progress(req)
            if req.status in FINISHED_REQUEST:
                return req
        raise TimeoutError(f"deletion {request_id} not finished after {timeout}s")
