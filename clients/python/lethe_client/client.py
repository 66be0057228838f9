"""Lethe's Python client, sync (`Client`) and async (`AsyncClient`), on httpx.

Every endpoint is a typed method that returns the API's answer as a light pydantic model
(`lethe_client.wire`; a certificate or the preview keeps a method's own keys as extras); every error
is a `LetheError` subclass carrying the API's `code`, `message` and `details`. Each endpoint
is written once, as a function that builds its `Call`; an `endpoint` descriptor makes it a
method of both clients, sent and parsed by `Client.send` or awaited by `AsyncClient.send`.
Importing this module loads httpx and pydantic only (no torch, scipy or dp-accounting).

    from lethe_client.client import Client
    c = Client("http://127.0.0.1:8000", "lethe_adm_...")
    model = c.wait_model(c.create_model({"name": "m", "dataset_id": 1}).id, on_progress=print)
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, overload

import httpx
from pydantic import BaseModel

from lethe_client.states import FINISHED_REQUEST, AuditStatus, ModelStatus, append_settled
from lethe_client.wire import (
    AppendOut,
    AuditOut,
    CertificateOut,
    CertificatePage,
    ChainCheck,
    DatasetOut,
    DatasetPage,
    DeletionOut,
    DeletionPage,
    HealthOut,
    KeyOut,
    ModelOut,
    PreviewOut,
    SamplePage,
    VersionOut,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")
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
        super().__init__(f"{status} {self.code}: {self.message}{_fields(self.details)}")


def _fields(details: Any) -> str:
    """A validation error's fields and messages, as `str(error)` shows them:
    " (epsilon: Input should be greater than 0)"."""
    if not isinstance(details, list):
        return ""
    said = []
    for item in details[:5]:
        if isinstance(item, dict) and "msg" in item:
            loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
            said.append(f"{'.'.join(loc) or 'request'}: {item['msg']}")
    return f" ({'; '.join(said)})" if said else ""


class Unauthorized(LetheError):
    """401: no key, or an unknown or revoked one."""


class Forbidden(LetheError):
    """403: the key's role may not do this."""


class NotFound(LetheError):
    """404: an unknown id."""


class Conflict(LetheError):
    """409: conflicts with the current state (e.g. a model still training)."""


class Gone(LetheError):
    """410: purged weights (trained on erased data, or superseded: see `code`)."""


class TooLarge(LetheError):
    """413: a body or dataset over the limits."""


class UnsupportedMediaType(LetheError):
    """415: the wrong content type."""


class Invalid(LetheError):
    """422: invalid input; `details` says where."""


class Unavailable(LetheError):
    """503: the database or the queue is down; retry after `retry_after` seconds."""


class Unreachable(LetheError):
    """No answer at all: the server is down, the URL is wrong, or the network failed (status 0;
    the transport's own exception is the `__cause__`)."""

    def __init__(self, url: str, exc: Exception) -> None:
        reason = str(exc) or type(exc).__name__
        body = {"error": {"code": "unreachable", "message": f"no answer from {url}: {reason}"}}
        super().__init__(0, body)


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


# ---- the endpoints, written once ------------------------------------------------------------


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


class endpoint(Generic[P, T]):  # noqa: N801 - used as a decorator-like field
    """A method of both clients from one `Call` builder: `Client.x(...)` returns the parsed
    answer, `AsyncClient.x(...)` a coroutine of it."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, client: None, owner: type) -> endpoint[P, T]: ...
    @overload
    def __get__(self, client: Client, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        build = self.build

        @functools.wraps(build)
        def send(*args: P.args, **kwargs: P.kwargs) -> Any:
            return client.send(build(*args, **kwargs))

        return send


def _health() -> Call[HealthOut]:
    """That the service answers (`/healthz`)."""
    return Call("GET", "/healthz", _model(HealthOut))


def _me() -> Call[KeyOut]:
    """The key this client uses."""
    return Call("GET", "/v1/keys/me", _model(KeyOut))


def _register_builtin(builtin: str, **options: Any) -> Call[DatasetOut]:
    """Register a built-in dataset (digits, breast_cancer, ...)."""
    body = {"builtin": builtin, **options}
    return Call("POST", "/v1/datasets", _model(DatasetOut), {"json": body})


def _upload_dataset(path: str | Path, fmt: str | None = None, **fields: Any) -> Call[DatasetOut]:
    """Upload a dataset file (npz, csv, text_csv, sparse_npz)."""
    path = Path(path)
    data = {k: str(v) for k, v in fields.items() if v is not None}
    if fmt:
        data["format"] = fmt
    files = {"file": (path.name, path.read_bytes())}
    return Call("POST", "/v1/datasets", _model(DatasetOut), {"files": files, "data": data})


def _append_samples(
    dataset_id: int, path: str | Path, fmt: str | None = None, **fields: Any
) -> Call[AppendOut]:
    """Append a file's rows (npz, csv, parquet; ids of your own) to a ready dataset: every
    model of it then learns them (`append` shows each model's learning)."""
    path = Path(path)
    data = {k: str(v) for k, v in fields.items() if v is not None}
    if fmt:
        data["format"] = fmt
    files = {"file": (path.name, path.read_bytes())}
    target = f"/v1/datasets/{dataset_id}/samples"
    return Call("POST", target, _model(AppendOut), {"files": files, "data": data})


def _append(dataset_id: int, append_id: int, wait: float = 0) -> Call[AppendOut]:
    """An append; `wait` long-polls up to that many seconds for it to settle (failed, or
    every model's learning of its rows ended)."""
    params = {"wait": wait} if wait else {}
    target = f"/v1/datasets/{dataset_id}/appends/{append_id}"
    return Call("GET", target, _model(AppendOut), {"params": params})


def _append_done(append: AppendOut) -> bool:
    return append_settled(append.status, (t.status for t in append.learning))


def _datasets(status: str | None = None, offset: int = 0, limit: int = 100) -> Call[DatasetPage]:
    """A page of the datasets, newest first (`status`: registering or ready)."""
    params = _params(status=status, offset=offset, limit=limit)
    return Call("GET", "/v1/datasets", _model(DatasetPage), {"params": params})


def _dataset(dataset_id: int) -> Call[DatasetOut]:
    return Call("GET", f"/v1/datasets/{dataset_id}", _model(DatasetOut))


def _samples(
    dataset_id: int,
    split: str | None = None,
    status: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> Call[SamplePage]:
    """A page of a dataset's samples."""
    params = _params(split=split, status=status, offset=offset, limit=limit)
    path = f"/v1/datasets/{dataset_id}/samples"
    return Call("GET", path, _model(SamplePage), {"params": params})


def _create_model(spec: dict[str, Any]) -> Call[ModelOut]:
    """Create a model (trained in the background: see `wait_model`)."""
    return Call("POST", "/v1/models", _model(ModelOut), {"json": spec})


def _models_list() -> Call[list[ModelOut]]:
    return Call("GET", "/v1/models", _models(ModelOut))


def _model_one(model_id: int) -> Call[ModelOut]:
    return Call("GET", f"/v1/models/{model_id}", _model(ModelOut))


def _versions(model_id: int) -> Call[list[VersionOut]]:
    return Call("GET", f"/v1/models/{model_id}/versions", _models(VersionOut))


def _version(model_id: int, number: int) -> Call[VersionOut]:
    return Call("GET", f"/v1/models/{model_id}/versions/{number}", _model(VersionOut))


def _weights(model_id: int, number: int | None = None) -> Call[bytes]:
    """A version's released safetensors bytes (the current one by default)."""
    path = f"/v1/models/{model_id}" + (f"/versions/{number}" if number else "") + "/weights"
    return Call("GET", path, _bytes)


def _delete(
    dataset_id: int,
    sample_ids: list[str] | None = None,
    subject_ids: list[str] | None = None,
    *,
    method: str | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    idempotency_key: str | None = None,
    wait: float = 0,
) -> Call[DeletionOut]:
    """Ask for samples (or subjects) to be forgotten; keep the answer's `opening`. With
    `wait`, the answer comes once the request is finished (or after that many seconds, at
    most 30, with its status then): `Prefer: wait` (RFC 7240), one round trip."""
    body = {
        "dataset_id": dataset_id,
        "sample_ids": sample_ids or [],
        "subject_ids": subject_ids or [],
        **_params(method=method, epsilon=epsilon, delta=delta),
    }
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    if wait > 0:
        headers["Prefer"] = f"wait={math.ceil(wait)}"
    return Call("POST", "/v1/deletions", _model(DeletionOut), {"json": body, "headers": headers})


def _deletion(request_id: int, wait: float = 0) -> Call[DeletionOut]:
    """A deletion request; `wait` long-polls up to that many seconds for it to finish."""
    params = {"wait": wait} if wait else {}
    return Call("GET", f"/v1/deletions/{request_id}", _model(DeletionOut), {"params": params})


def _receipt(request_id: int, certificate_id: int) -> Call[bytes]:
    """A deletion's receipt for one certificate: a C2SP tlog-proof file that /verify (or any
    tlog client) checks against the public log; the key that asked for the deletion may read
    it."""
    path = f"/v1/deletions/{request_id}/tlog-proofs/{certificate_id}"
    return Call("GET", path, _bytes, {})


def _deletions(offset: int = 0, limit: int = 100) -> Call[DeletionPage]:
    params = {"offset": offset, "limit": limit}
    return Call("GET", "/v1/deletions", _model(DeletionPage), {"params": params})


def _certificates(
    model: int | None = None,
    subject: str | None = None,
    since: str | None = None,
    offset: int = 0,
    limit: int = 100,
) -> Call[list[CertificateOut]]:
    """Certificates in chain order (auditors and admins)."""
    params = _params(model=model, subject=subject, since=since, offset=offset, limit=limit)
    parse = _model(CertificatePage)
    return Call("GET", "/v1/audit/certificates", lambda r: parse(r).items, {"params": params})


def _certificate(certificate_id: int) -> Call[CertificateOut]:
    return Call("GET", f"/v1/audit/certificates/{certificate_id}", _model(CertificateOut))


def _verify() -> Call[ChainCheck]:
    """The hash chain recomputed by the server."""
    return Call("GET", "/v1/audit/verify", _model(ChainCheck))


def _export() -> Call[bytes]:
    """The whole log as JSONL (scripts/verify_audit.py checks it offline)."""
    return Call("GET", "/v1/audit/export", _bytes)


def _preview(
    model: int, epsilon: float | None = None, delta: float | None = None
) -> Call[PreviewOut]:
    """σ, feasibility and lineage cost of the model's next release."""
    params = _params(model=model, epsilon=epsilon, delta=delta)
    return Call("GET", "/v1/privacy/preview", _model(PreviewOut), {"params": params})


def _start_audit(model_id: int, **options: Any) -> Call[AuditOut]:
    """Queue a privacy audit of the model's certificates (auditors and admins): `canaries`,
    `kind`, `score`, `confidence`, `control`."""
    return Call("POST", f"/v1/models/{model_id}/audits", _model(AuditOut), {"json": options})


def _audit(audit_id: int) -> Call[AuditOut]:
    return Call("GET", f"/v1/audits/{audit_id}", _model(AuditOut))


def _audits(model_id: int) -> Call[list[AuditOut]]:
    return Call("GET", f"/v1/models/{model_id}/audits", _models(AuditOut))


def _create_key(role: str, name: str = "api key") -> Call[KeyOut]:
    return Call("POST", "/v1/keys", _model(KeyOut), {"json": {"role": role, "name": name}})


def _revoke_key(key_id: int) -> Call[None]:
    return Call("DELETE", f"/v1/keys/{key_id}", _none)


class Endpoints:
    """The API, one line an endpoint; both clients inherit it."""

    health = endpoint(_health)
    me = endpoint(_me)
    register_builtin = endpoint(_register_builtin)
    upload_dataset = endpoint(_upload_dataset)
    append_samples = endpoint(_append_samples)
    append = endpoint(_append)
    datasets = endpoint(_datasets)
    dataset = endpoint(_dataset)
    samples = endpoint(_samples)
    create_model = endpoint(_create_model)
    models = endpoint(_models_list)
    model = endpoint(_model_one)
    versions = endpoint(_versions)
    version = endpoint(_version)
    weights = endpoint(_weights)
    delete = endpoint(_delete)
    deletion = endpoint(_deletion)
    deletions = endpoint(_deletions)
    receipt = endpoint(_receipt)
    certificates = endpoint(_certificates)
    certificate = endpoint(_certificate)
    verify = endpoint(_verify)
    export = endpoint(_export)
    preview = endpoint(_preview)
    start_audit = endpoint(_start_audit)
    audit = endpoint(_audit)
    audits = endpoint(_audits)
    create_key = endpoint(_create_key)
    revoke_key = endpoint(_revoke_key)


def _settings(url: str | None, key: str | None) -> tuple[str, str]:
    return (
        (url or os.environ.get("LETHE_URL", DEFAULT_URL)).rstrip("/"),
        key or os.environ.get("LETHE_API_KEY", ""),
    )


def _poll(
    fetch: Callable[[float], T],
    finished: Callable[[T], bool],
    on_progress: Callable[[T], None] | None,
    timeout: float,
    pause: float,
    late: str,
) -> T:
    """Fetch (given the deadline) until `finished`, showing each answer to `on_progress` and
    pausing `pause` s between fetches; TimeoutError(`late`) at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = fetch(deadline)
        if on_progress:
            on_progress(answer)
        if finished(answer):
            return answer
        time.sleep(pause)
    raise TimeoutError(f"{late} after {timeout}s")


async def _poll_async(
    fetch: Callable[[float], Awaitable[T]],
    finished: Callable[[T], bool],
    on_progress: Callable[[T], None] | None,
    timeout: float,
    pause: float,
    late: str,
) -> T:
    """`_poll` for the async client."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = await fetch(deadline)
        if on_progress:
            on_progress(answer)
        if finished(answer):
            return answer
        await asyncio.sleep(pause)
    raise TimeoutError(f"{late} after {timeout}s")


def _poll_window(http: httpx.Client | httpx.AsyncClient, poll: float, deadline: float) -> float:
    """How long one long poll may wait: under the read timeout and the caller's deadline."""
    read_timeout = http.timeout.read or 60.0
    return max(0.0, min(poll, read_timeout - 1.0, deadline - time.monotonic()))


# ---- sync -----------------------------------------------------------------------------------


class Client(Endpoints):
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
        return call.parse(self.request(call.method, call.path, **call.kwargs))

    # Untyped access to any path (JSON in, JSON out), for scripts and the benches.
    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:  # refused, unresolvable, timed out, cut off
            raise Unreachable(str(self.http.base_url), exc) from exc
        if response.status_code >= 400:
            raise error_for(response)
        return response

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw).json()

    def wait_model(
        self,
        model_id: int,
        on_progress: Callable[[ModelOut], None] | None = None,
        timeout: float = 3600,
    ) -> ModelOut:
        """Poll until the model is ready or failed; `on_progress(model)` sees each poll (with
        `progress`: stage, epoch, epochs)."""
        return _poll(
            lambda _: self.model(model_id),
            lambda m: m.status in (ModelStatus.ready, ModelStatus.failed),
            on_progress,
            timeout,
            0.3,
            f"model {model_id} not ready",
        )

    def wait_deletion(
        self,
        request_id: int,
        on_progress: Callable[[DeletionOut], None] | None = None,
        timeout: float = 3600,
        poll: float = 20.0,
    ) -> DeletionOut:
        """Long-poll until the request is done or failed; `on_progress(request)` sees each
        answer (every `poll` seconds at most), with its per-model progress."""
        return _poll(
            lambda deadline: self.deletion(
                request_id, wait=_poll_window(self.http, poll, deadline)
            ),
            lambda r: r.status in FINISHED_REQUEST,
            on_progress,
            timeout,
            0.0,  # the long poll waits on the server
            f"deletion {request_id} not finished",
        )

    def wait_append(
        self,
        dataset_id: int,
        append_id: int,
        on_progress: Callable[[AppendOut], None] | None = None,
        timeout: float = 3600,
        poll: float = 20.0,
    ) -> AppendOut:
        """Long-poll until the append has failed or every model has learned its rows (or
        failed to); `on_progress(append)` sees each answer (every `poll` seconds at most)."""
        return _poll(
            lambda deadline: self.append(
                dataset_id, append_id, wait=_poll_window(self.http, poll, deadline)
            ),
            _append_done,
            on_progress,
            timeout,
            0.0,  # the long poll waits on the server
            f"append {append_id} not settled",
        )

    def wait_audit(
        self,
        audit_id: int,
        on_progress: Callable[[AuditOut], None] | None = None,
        timeout: float = 3600,
    ) -> AuditOut:
        """Poll until the audit is done or failed; `on_progress(audit)` sees its stage."""
        return _poll(
            lambda _: self.audit(audit_id),
            lambda a: a.status in (AuditStatus.done, AuditStatus.failed),
            on_progress,
            timeout,
            0.5,
            f"audit {audit_id} not finished",
        )


# ---- async ----------------------------------------------------------------------------------


class AsyncClient(Endpoints):
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
        try:
            response = await self.http.request(call.method, call.path, **call.kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(str(self.http.base_url), exc) from exc
        if response.status_code >= 400:
            raise error_for(response)
        return call.parse(response)

    async def wait_model(
        self,
        model_id: int,
        on_progress: Callable[[ModelOut], None] | None = None,
        timeout: float = 3600,
    ) -> ModelOut:
        return await _poll_async(
            lambda _: self.model(model_id),
            lambda m: m.status in (ModelStatus.ready, ModelStatus.failed),
            on_progress,
            timeout,
            0.3,
            f"model {model_id} not ready",
        )

    async def wait_deletion(
        self,
        request_id: int,
        on_progress: Callable[[DeletionOut], None] | None = None,
        timeout: float = 3600,
        poll: float = 20.0,
    ) -> DeletionOut:
        return await _poll_async(
            lambda deadline: self.deletion(
                request_id, wait=_poll_window(self.http, poll, deadline)
            ),
            lambda r: r.status in FINISHED_REQUEST,
            on_progress,
            timeout,
            0.0,  # the long poll waits on the server
            f"deletion {request_id} not finished",
        )

    async def wait_append(
        self,
        dataset_id: int,
        append_id: int,
        on_progress: Callable[[AppendOut], None] | None = None,
        timeout: float = 3600,
        poll: float = 20.0,
    ) -> AppendOut:
        return await _poll_async(
            lambda deadline: self.append(
                dataset_id, append_id, wait=_poll_window(self.http, poll, deadline)
            ),
            _append_done,
            on_progress,
            timeout,
            0.0,  # the long poll waits on the server
            f"append {append_id} not settled",
        )

    async def wait_audit(
        self,
        audit_id: int,
        on_progress: Callable[[AuditOut], None] | None = None,
        timeout: float = 3600,
    ) -> AuditOut:
        """Poll until the audit is done or failed; `on_progress(audit)` sees its stage."""
        return await _poll_async(
            lambda _: self.audit(audit_id),
            lambda a: a.status in (AuditStatus.done, AuditStatus.failed),
            on_progress,
            timeout,
            0.5,
            f"audit {audit_id} not finished",
        )
