"""Models: create (a training job), read, versions, and released weights (safetensors)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from sqlalchemy import select

from app.api.deps import (
    Admin,
    AnyRole,
    DbDep,
    DispatcherDep,
    ReaderRole,
    RuntimeDep,
    SettingsDep,
)
from app.api.limits import read_upload
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core.db.tables import Model
from app.core.dispatch import TRAIN
from app.core.errors import APIError, unprocessable
from app.core.jsontypes import JsonObject, JsonValue
from app.core.runtime import Runtime
from app.core.schemas import MAX_ID, ModelCreate, ModelOut, VersionOut
from app.core.security import sees_forget_set
from app.core.services.models import (
    create_model,
    get_model,
    get_version,
    import_model,
    list_versions,
    model_view,
    released_weights,
)
from app.core.services.weights_cache import WeightsCache
from methods import get_method, method_names

router = APIRouter(prefix="/v1/models", tags=["models"], responses=COMMON)

WEIGHTS_DOC: dict[int | str, JsonObject] = {
    200: {
        "description": "safetensors bytes; `ETag` is their sha256",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    206: {
        "description": "The byte range a `Range: bytes=…` header asked for (`Content-Range`)",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    304: {"description": "Not modified (`If-None-Match` names the current ETag)"},
    **errors(404, 409, 410, 416, 500),
}


@router.post("", status_code=202, response_model=ModelOut, responses=errors(404, 409))
def create(
    spec: Annotated[ModelCreate, Body(openapi_examples=MODEL_EXAMPLES)],
    _: Admin,
    db: DbDep,
    dispatcher: DispatcherDep,
    settings: SettingsDep,
) -> JsonObject:
    """Register a model and queue its training; poll GET /v1/models/{id} for progress. A model
    whose job would not fit the memory budget is refused (422 `model_too_large`)."""
    with db.write() as session:
        model = create_model(session, spec, settings.job_memory_limit)
        view = model_view(session, model)
    dispatcher.enqueue(TRAIN, model.id)
    return view


MODEL_EXAMPLES: JsonObject = {
    "mlp": {
        "summary": "an MLP on digits, exact retraining",
        "value": {
            "name": "digits-mlp",
            "dataset_id": 1,
            "architecture": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
            "training": {"epochs": 20, "batch_size": 64, "learning_rate": 0.1, "seed": 0},
            "method": {"name": "retrain"},
        },
    },
    **{
        n: get_method(n).examples["model"]
        for n in method_names()
        if "model" in get_method(n).examples
    },
}
_DEFAULT_IMPORT: JsonObject = {
    "name": "imported",
    "dataset_id": 1,
    "architecture": '{"type": "logreg"}',
}
IMPORT_EXAMPLE: JsonValue = next(
    (
        get_method(n).examples["import"]["value"]
        for n in method_names()
        if "import" in get_method(n).examples
    ),
    _DEFAULT_IMPORT,
)

IMPORT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "example": IMPORT_EXAMPLE,
                "schema": {
                    "type": "object",
                    "required": ["weights", "name", "dataset_id", "architecture", "method"],
                    "properties": {
                        "weights": {"type": "string", "format": "binary"},
                        "name": {"type": "string"},
                        "dataset_id": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                        "architecture": {"type": "string", "description": "JSON spec"},
                        "method": {"type": "string", "description": "JSON method config"},
                        "privacy": {"type": "string", "description": "JSON policy"},
                        "training": {
                            "type": "string",
                            "description": "JSON (fine-tuning, retrain)",
                        },
                    },
                },
            }
        },
    }
}


@router.post(
    "/import",
    status_code=202,
    response_model=ModelOut,
    responses=errors(400, 404, 409),
    openapi_extra=IMPORT_DOC,
)
async def import_weights(
    request: Request, _: Admin, runtime: RuntimeDep, dispatcher: DispatcherDep
) -> JsonObject:
    """Bring a model trained elsewhere: safetensors weights, an architecture spec, a dataset.
    Only methods that need no training-time recording can serve it."""
    form = await request.form(max_files=1, max_fields=20)
    upload = form.get("weights")
    if upload is None or isinstance(upload, str):
        raise unprocessable("missing_file", "multipart field 'weights' is required")
    limit = runtime.settings.max_upload_bytes
    data = await read_upload(upload, limit)
    if len(data) > limit:
        raise APIError(413, "payload_too_large", "weights exceed the upload limit")
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    try:
        body: JsonObject = {
            "name": fields.get("name", ""),
            "dataset_id": _form_int(fields.get("dataset_id")),
            **{
                k: json.loads(fields[k])
                for k in ("architecture", "method", "privacy", "training")
                if k in fields
            },
        }
        spec = ModelCreate.model_validate(body)
    except json.JSONDecodeError as exc:
        raise unprocessable("invalid_request", f"a JSON field is malformed: {exc}") from exc
    except ValidationError as exc:
        raise unprocessable(
            "invalid_request",
            "invalid model spec",
            [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()],
        ) from exc

    model_id, view = await run_in_threadpool(import_model, runtime.db, runtime.blobs, spec, data)
    dispatcher.enqueue(TRAIN, model_id)
    return view


def _form_int(value: str | None) -> int | str | None:
    """A form field is text: an integer's digits become the integer (the body is strict)."""
    if value is not None and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


@router.get("", response_model=list[ModelOut])
def list_models(key: AnyRole, db: DbDep) -> list[JsonObject]:
    with db.read() as session:
        return [
            model_view(session, m, sees_forget_set(key))
            for m in session.scalars(select(Model).order_by(Model.id))
        ]


@router.get("/{model_id:int}", response_model=ModelOut, responses=errors(404))
def read(model_id: PathId, key: AnyRole, db: DbDep) -> JsonObject:
    with db.read() as session:
        return model_view(session, get_model(session, model_id), sees_forget_set(key))


@router.get("/{model_id:int}/versions", response_model=list[VersionOut], responses=errors(404))
def versions(model_id: PathId, key: AnyRole, db: DbDep, settings: SettingsDep) -> list[JsonObject]:
    """Every version; forget-set metrics only for admins and auditors."""
    with db.read() as session:
        return list_versions(
            session, model_id, sees_forget_set(key), settings.mlflow_tracking_uri is not None
        )


@router.get(
    "/{model_id:int}/versions/{number:int}", response_model=VersionOut, responses=errors(404)
)
def version(
    model_id: PathId, number: PathId, key: AnyRole, db: DbDep, settings: SettingsDep
) -> JsonObject:
    with db.read() as session:
        get_version(session, model_id, number)  # 404 for an unknown model or version
        views = list_versions(
            session, model_id, sees_forget_set(key), settings.mlflow_tracking_uri is not None
        )
        return next(v for v in views if v["number"] == number)


@router.get("/{model_id:int}/weights", response_class=Response, responses=WEIGHTS_DOC)
def current_weights(
    model_id: PathId, request: Request, _: ReaderRole, runtime: RuntimeDep
) -> Response:
    """The current released weights; `ETag` is the sha256 of the bytes."""
    return _weights(request, runtime, model_id, None)


@router.get(
    "/{model_id:int}/versions/{number:int}/weights", response_class=Response, responses=WEIGHTS_DOC
)
def version_weights(
    model_id: PathId, number: PathId, request: Request, _: ReaderRole, runtime: RuntimeDep
) -> Response:
    """One version's weights; 410 Gone once it was purged for carrying erased data."""
    return _weights(request, runtime, model_id, number)


def _weights(request: Request, runtime: Runtime, model_id: int, number: int | None) -> Response:
    """Conditional (`If-None-Match`: 304 with no body), ranged (`Range: bytes=…`, one range,
    206; `If-Range` honoured) and streamed: a large blob is opened chunk by chunk as it is
    sent, a small one served from the process's cache by sha256. The version row is read
    every time, so a purged version is 410 at once. The first chunk is opened before any
    header is sent: a missing object is 503 and a corrupt one 500, never wrong bytes."""
    cache: WeightsCache = request.app.state.weights_cache
    db, store = runtime.db, runtime.blobs
    with db.read() as session:
        v = get_version(session, model_id, number)
        etag = f'"{v.weights_sha256}"'
        headers = {
            "ETag": etag,
            "Accept-Ranges": "bytes",
            "Cache-Control": "no-cache",  # clients revalidate with If-None-Match
            "X-Lethe-Version": str(v.number),
            "Content-Disposition": f'attachment; filename="model-{model_id}-v{v.number}'
            '.safetensors"',
        }
        if v.erased_at is not None:
            cache.forget(v.weights_sha256)
            released_weights(session, store, v)  # raises 410
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        span = requested_range(request.headers, etag, v.weights_size)
        data = cache.get(v.weights_sha256)
        handle = None if data is not None else released_weights(session, store, v)
    if handle is not None and handle.size <= cache.max_bytes // 16:
        data = bytes(handle.read())
        cache.put(v.weights_sha256, data)
    start, end = span or (0, v.weights_size)
    status = 200 if span is None else 206
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{v.weights_size}"
    if data is not None:
        return Response(data[start:end], status, headers, "application/octet-stream")
    assert handle is not None
    chunks = handle.chunks(start, end)
    first = next(chunks, b"")  # raises BlobMissing / SealError while a status can still be sent
    headers["Content-Length"] = str(end - start)
    return StreamingResponse(
        itertools.chain((first,), chunks), status, headers, "application/octet-stream"
    )


def requested_range(headers: Mapping[str, str], etag: str, size: int) -> tuple[int, int] | None:
    """The one byte range [start, end) a `Range` header asks for, or None for the whole body
    (no header, a syntax this server ignores as RFC 9110 §14.2 allows, several ranges, or an
    `If-Range` naming other bytes). 416 when the range starts past the end."""
    value = headers.get("range")
    if not value or headers.get("if-range", etag) != etag:
        return None
    match = _RANGE.fullmatch(value.strip())
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if first:
        start = int(first)
        end = min(int(last) + 1, size) if last else size
        if last and int(last) < start:
            return None
    elif last:
        start, end = max(size - int(last), 0), size
        if int(last) == 0:
            start = size
    else:
        return None
    if start >= size:
        raise APIError(
            416,
            "range_not_satisfiable",
            f"the weights are {size} bytes; the range starts past the end",
            headers={"Content-Range": f"bytes */{size}"},
        )
    return start, end


_RANGE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")
