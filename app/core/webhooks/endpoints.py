"""Webhook endpoints as an admin manages them: made with a fresh `whsec_` secret
(shown once; stored wrapped under the master key), listed, deleted, their secret rotated (the
previous one keeps signing beside the new one for a grace period, so a receiver can switch
without losing a message), re-enabled, and their deliveries listed and replayed."""

from __future__ import annotations

import base64
import os
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.tables import WebhookDelivery, WebhookEndpoint, utcnow
from app.core.errors import not_found, unprocessable
from app.core.states import DeliveryStatus
from app.core.storage.crypto import Keyring
from app.core.webhooks.events import EVENT_TYPES
from app.core.webhooks.network import Refused, check_url

SECRET_BYTES = 32
SECRET_PREFIX = "whsec_"
ROTATION_GRACE = timedelta(hours=24)


def new_secret(ring: Keyring) -> tuple[str, bytes]:
    """A fresh secret: its `whsec_` text (for the admin, once) and its wrapped bytes."""
    raw = os.urandom(SECRET_BYTES)
    return SECRET_PREFIX + base64.b64encode(raw).decode(), ring.wrap(raw)


def secrets_of(ring: Keyring, endpoint: WebhookEndpoint, now: datetime) -> list[bytes]:
    """The raw secrets that sign a message now: the current one, and the previous one while
    its rotation's grace period lasts."""
    found = [ring.unwrap(endpoint.secret_wrapped)]
    previous, until = endpoint.previous_secret_wrapped, endpoint.previous_until
    if previous is not None and until is not None and now < until:
        found.append(ring.unwrap(previous))
    return found


def create_endpoint(
    session: Session,
    ring: Keyring,
    url: str,
    events: list[str],
    description: str,
    allow_private: bool,
) -> tuple[WebhookEndpoint, str]:
    """A new endpoint and its secret's text (422 for an unknown event or a refused URL)."""
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise unprocessable(
            "unknown_event", f"unknown event types {unknown}; known: {list(EVENT_TYPES)}"
        )
    try:
        check_url(url, allow_private)
    except Refused as exc:
        raise unprocessable("webhook_url_refused", str(exc)) from exc
    text, wrapped = new_secret(ring)
    endpoint = WebhookEndpoint(
        url=url,
        events=sorted(set(events)),
        description=description,
        allow_private=allow_private,
        secret_wrapped=wrapped,
    )
    session.add(endpoint)
    session.flush()
    return endpoint, text


def get_endpoint(session: Session, endpoint_id: int) -> WebhookEndpoint:
    endpoint = session.get(WebhookEndpoint, endpoint_id)
    if endpoint is None:
        raise not_found("webhook", endpoint_id)
    return endpoint


def list_endpoints(session: Session) -> list[WebhookEndpoint]:
    return list(session.scalars(select(WebhookEndpoint).order_by(WebhookEndpoint.id)))


def delete_endpoint(session: Session, endpoint_id: int) -> None:
    """The endpoint and its delivery log (what was not yet sent is not sent)."""
    session.delete(get_endpoint(session, endpoint_id))


def rotate_secret(session: Session, ring: Keyring, endpoint_id: int) -> tuple[WebhookEndpoint, str]:
    """A new secret; the current one becomes the previous and signs beside it for
    ROTATION_GRACE."""
    endpoint = get_endpoint(session, endpoint_id)
    text, wrapped = new_secret(ring)
    endpoint.previous_secret_wrapped = endpoint.secret_wrapped
    endpoint.previous_until = utcnow() + ROTATION_GRACE
    endpoint.secret_wrapped = wrapped
    return endpoint, text


def enable_endpoint(session: Session, endpoint_id: int) -> WebhookEndpoint:
    """Re-enable an endpoint the sender disabled; its failed count starts again."""
    endpoint = get_endpoint(session, endpoint_id)
    endpoint.disabled_at, endpoint.disabled_reason = None, None
    endpoint.consecutive_failures = 0
    return endpoint


def list_deliveries(
    session: Session, endpoint_id: int, offset: int, limit: int
) -> tuple[list[WebhookDelivery], int]:
    """An endpoint's deliveries, newest first, and how many there are."""
    get_endpoint(session, endpoint_id)
    where = WebhookDelivery.endpoint_id == endpoint_id
    total = session.scalar(select(func.count()).select_from(WebhookDelivery).where(where)) or 0
    rows = session.scalars(
        select(WebhookDelivery)
        .where(where)
        .order_by(WebhookDelivery.id.desc())
        .offset(offset)
        .limit(limit)
    )
    return list(rows), total


def replay_delivery(session: Session, endpoint_id: int, delivery_id: int) -> WebhookDelivery:
    """Send one delivery again, now, with the same message id (a receiver that saw it
    deduplicates by `webhook-id`)."""
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.endpoint_id != endpoint_id:
        raise not_found("delivery", delivery_id, webhook=endpoint_id)
    delivery.status = DeliveryStatus.pending
    delivery.next_attempt_at = utcnow()
    delivery.created_at = utcnow()  # its retry window starts again
    return delivery
