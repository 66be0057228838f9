"""Models: create (a training job), read, versions, and released weights (safetensors)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select

from app.api.deps import Admin, AnyRole, DbDep, DispatcherDep, ReaderRole
from app.db.tables import Model
from app.dispatch import TRAIN
from app.schemas import ModelCreate, ModelOut, VersionOut
from app.services.models import (
    create_model,
    get_model,
    get_version,
    list_versions,
    model_view,
    released_weights,
)

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.post("", status_code=202, response_model=ModelOut)
def create(spec: ModelCreate, _: Admin, db: DbDep, dispatcher: DispatcherDep) -> dict[str, Any]:
    """Register a model and queue its training; poll GET /v1/models/{id} for progress."""
    with db.begin() as session:
        model = create_model(session, spec)
        view = model_view(session, model)
    dispatcher.enqueue(TRAIN, model.id)
    return view


@router.get("", response_model=list[ModelOut])
def list_models(_: AnyRole, db: DbDep) -> list[dict[str, Any]]:
    with db() as session:
        return [model_view(session, m) for m in session.scalars(select(Model).order_by(Model.id))]


@router.get("/{model_id}", response_model=ModelOut)
def read(model_id: int, _: AnyRole, db: DbDep) -> dict[str, Any]:
    with db() as session:
        return model_view(session, get_model(session, model_id))


@router.get("/{model_id}/versions", response_model=list[VersionOut])
def versions(model_id: int, _: AnyRole, db: DbDep) -> list[dict[str, Any]]:
    with db() as session:
        return list_versions(session, model_id)


@router.get("/{model_id}/versions/{number}", response_model=VersionOut)
def version(model_id: int, number: int, _: AnyRole, db: DbDep) -> dict[str, Any]:
    with db() as session:
        get_version(session, model_id, number)  # 404 for an unknown model or version
        return next(v for v in list_versions(session, model_id) if v["number"] == number)


@router.get("/{model_id}/weights", responses={200: {"content": {"application/octet-stream": {}}}})
def current_weights(model_id: int, request: Request, _: ReaderRole, db: DbDep) -> Response:
    """The current released weights; `ETag` is the sha256 of the bytes."""
    return _weights(request, db, model_id, None)


@router.get(
    "/{model_id}/versions/{number}/weights",
    responses={200: {"content": {"application/octet-stream": {}}}, 410: {}},
)
def version_weights(
    model_id: int, number: int, request: Request, _: ReaderRole, db: DbDep
) -> Response:
    """One version's weights; 410 Gone once it was purged for carrying erased data."""
    return _weights(request, db, model_id, number)


def _weights(request: Request, db: DbDep, model_id: int, number: int | None) -> Response:
    with db() as session:
        v = get_version(session, model_id, number)
        etag = f'"{v.weights_sha256}"'
        headers = {
            "ETag": etag,
            "X-Lethe-Version": str(v.number),
            "Content-Disposition": f'attachment; filename="model-{model_id}-v{v.number}'
            '.safetensors"',
        }
        if request.headers.get("if-none-match") == etag and v.erased_at is None:
            return Response(status_code=304, headers=headers)
        data = released_weights(session, v)
    return Response(data, media_type="application/octet-stream", headers=headers)
