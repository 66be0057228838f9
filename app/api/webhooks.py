"""Webhook endpoints: make one (its secret shown once), list, read,
delete, rotate its secret, re-enable it, list its deliveries and replay one. The HTTP layer
validates and delegates to app/core/webhooks/endpoints.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Response

from app.api.deps import Admin, DbDep, RuntimeDep
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core.db.tables import WebhookEndpoint
from app.core.schemas import WebhookCreate
from app.core.webhooks import endpoints
from app.core.wire import DeliveryOut, DeliveryPage, WebhookOut

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], responses=COMMON)
EXAMPLES = {
    "deletions": {
        "summary": "finished deletions only",
        "value": {"url": "https://hooks.example.com/lethe", "events": ["deletion.completed"]},
    },
    "all": {
        "summary": "every event, to a receiver on the private network",
        "value": {
            "url": "http://10.0.0.5:9000/lethe",
            "description": "privacy desk",
            "allow_private": True,
        },
    },
}


def _out(endpoint: WebhookEndpoint, secret: str | None = None) -> WebhookOut:
    out = WebhookOut.model_validate(endpoint)
    return out.model_copy(
        update={"secret": secret, "previous_secret_until": endpoint.previous_until}
    )


@router.post("", status_code=201, response_model=WebhookOut, responses=errors(422))
def create(
    body: Annotated[WebhookCreate, Body(openapi_examples=EXAMPLES)], _: Admin, runtime: RuntimeDep
) -> WebhookOut:
    """Receive events at `url`; the answer holds the `whsec_` secret, shown only here."""
    with runtime.db.write() as session:
        endpoint, secret = endpoints.create_endpoint(
            session, runtime.keyring, body.url, body.events, body.description, body.allow_private
        )
        return _out(endpoint, secret)


@router.get("", response_model=list[WebhookOut])
def list_all(_: Admin, db: DbDep) -> list[WebhookOut]:
    with db.read() as session:
        return [_out(e) for e in endpoints.list_endpoints(session)]


@router.get("/{webhook_id}", response_model=WebhookOut, responses=errors(404))
def read(webhook_id: PathId, _: Admin, db: DbDep) -> WebhookOut:
    with db.read() as session:
        return _out(endpoints.get_endpoint(session, webhook_id))


@router.delete("/{webhook_id}", status_code=204, responses=errors(404))
def delete(webhook_id: PathId, _: Admin, db: DbDep) -> Response:
    """The endpoint and its delivery log; nothing more is sent to it."""
    with db.write() as session:
        endpoints.delete_endpoint(session, webhook_id)
    return Response(status_code=204)


@router.post("/{webhook_id}/rotate", response_model=WebhookOut, responses=errors(404))
def rotate(webhook_id: PathId, _: Admin, runtime: RuntimeDep) -> WebhookOut:
    """A new secret (shown once); the previous one signs beside it for 24 hours."""
    with runtime.db.write() as session:
        endpoint, secret = endpoints.rotate_secret(session, runtime.keyring, webhook_id)
        return _out(endpoint, secret)


@router.post("/{webhook_id}/enable", response_model=WebhookOut, responses=errors(404))
def enable(webhook_id: PathId, _: Admin, db: DbDep) -> WebhookOut:
    """Resume an endpoint the sender disabled after repeated failure."""
    with db.write() as session:
        return _out(endpoints.enable_endpoint(session, webhook_id))


@router.get("/{webhook_id}/deliveries", response_model=DeliveryPage, responses=errors(404))
def deliveries(
    webhook_id: PathId,
    _: Admin,
    db: DbDep,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The endpoint's deliveries, newest first: status, attempts, the receiver's last answer."""
    with db.read() as session:
        items, total = endpoints.list_deliveries(session, webhook_id, offset, limit)
        return {
            "items": [DeliveryOut.model_validate(d) for d in items],
            "total": total,
            "offset": offset,
            "limit": limit,
        }


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/replay",
    response_model=DeliveryOut,
    responses=errors(404),
)
def replay(webhook_id: PathId, delivery_id: PathId, _: Admin, db: DbDep) -> DeliveryOut:
    """Send one delivery again now, with the same `webhook-id`."""
    with db.write() as session:
        return DeliveryOut.model_validate(
            endpoints.replay_delivery(session, webhook_id, delivery_id)
        )
