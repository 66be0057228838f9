"""The webhook sender: one daemon thread in each API process sends the outbox's due
deliveries, each signed per Standard Webhooks (`webhook-id`, `webhook-timestamp`,
`webhook-signature`: HMAC-SHA256 over `id.timestamp.body`, by the `standardwebhooks` package),
with the CloudEvent as the body. At least once: a delivery is claimed for one attempt (its next
attempt moved past the attempt's timeout, so another sender leaves it), sent with no
transaction open, and its outcome committed after; a sender killed between the two sends it
again with the same `webhook-id`. A pass's outcomes are committed together. A failure is
retried with exponential back-off and jitter for `webhook_retry_hours`;
`webhook_disable_after` consecutive failures disable the endpoint."""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from prometheus_client import REGISTRY, Counter, Histogram
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook

from app.core.db.session import Database
from app.core.db.tables import WebhookDelivery, WebhookEndpoint, utcnow
from app.core.settings import Settings
from app.core.states import DeliveryStatus
from app.core.storage.crypto import Keyring
from app.core.webhooks.endpoints import secrets_of
from app.core.webhooks.network import Refused, check_url

log = logging.getLogger("lethe.webhooks")
BATCH = 20  # deliveries claimed per pass
MAX_BACKOFF = timedelta(hours=1)
DELIVERIES = Counter(
    "lethe_webhook_deliveries_total", "Webhook delivery attempts by outcome", ["outcome"]
)
DISABLED = Counter(
    "lethe_webhook_endpoints_disabled_total", "Webhook endpoints disabled after repeated failure"
)
LATENCY = Histogram(
    "lethe_webhook_delivery_seconds",
    "From the event's commit to its delivery",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
)


SENDER_METRICS = (DELIVERIES, DISABLED, LATENCY)
_reported_here = [True]  # whether this process's registry holds SENDER_METRICS


def report_here(sends: bool) -> None:
    """Whether this process's /metrics shows the sender's metrics: only where a sender runs
    (an API whose worker is a process relays that process's instead; the same family twice
    would be an invalid exposition)."""
    if sends == _reported_here[0]:
        return
    for metric in SENDER_METRICS:
        (REGISTRY.register if sends else REGISTRY.unregister)(metric)
    _reported_here[0] = sends


@dataclass(frozen=True)
class Claimed:
    """One delivery claimed for one attempt: what the POST needs, read in the claim."""

    id: int
    url: str
    allow_private: bool
    message_id: str
    body: str
    secrets: list[bytes]


def signed_headers(
    message_id: str, body: str, secrets: list[bytes], at: datetime
) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt: one `v1,` signature per valid secret."""
    signatures = " ".join(Webhook(s).sign(message_id, at, body) for s in secrets)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
        "content-type": "application/cloudevents+json",
        "user-agent": "lethe-webhooks/1",
    }


def _any_due(db: Database, now: datetime) -> bool:
    """Whether a delivery is due: most passes find none, and take no write lock for that."""
    with db.read() as session:
        due = session.scalar(
            select(WebhookDelivery.id)
            .where(
                WebhookDelivery.status == DeliveryStatus.pending,
                WebhookDelivery.next_attempt_at <= now,
            )
            .limit(1)
        )
    return due is not None


def claim(db: Database, ring: Keyring, lease: timedelta, now: datetime) -> list[Claimed]:
    """Up to BATCH due deliveries of enabled endpoints, each claimed by moving its next
    attempt `lease` ahead (a delivery another sender claimed first is skipped)."""
    out: list[Claimed] = []
    if not _any_due(db, now):
        return out
    # not durable: a claim lost in a crash only means the delivery is sent again (at least once)
    with db.write(durable=False) as session:
        rows = session.execute(
            select(WebhookDelivery, WebhookEndpoint)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(
                WebhookDelivery.status == DeliveryStatus.pending,
                WebhookDelivery.next_attempt_at <= now,
                WebhookEndpoint.disabled_at.is_(None),
            )
            .order_by(WebhookDelivery.id)
            .limit(BATCH)
        ).all()
        for delivery, endpoint in rows:
            moved = session.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == delivery.id,
                    WebhookDelivery.status == DeliveryStatus.pending,
                    WebhookDelivery.next_attempt_at <= now,
                )
                .values(next_attempt_at=now + lease)
                .execution_options(synchronize_session=False)
            )
            if moved.rowcount == 1:  # type: ignore[attr-defined]
                out.append(
                    Claimed(
                        delivery.id,
                        endpoint.url,
                        endpoint.allow_private,
                        delivery.message_id,
                        delivery.body,
                        secrets_of(ring, endpoint, now),
                    )
                )
    return out


def attempt(client: httpx.Client, item: Claimed) -> tuple[int | None, str | None]:
    """One POST: (status, None) for an answer, (None, why) when none came or the URL is
    refused now (it may resolve elsewhere than when the endpoint was made)."""
    try:
        check_url(item.url, item.allow_private)
        at = utcnow()
        response = client.post(
            item.url,
            content=item.body.encode(),
            headers=signed_headers(item.message_id, item.body, item.secrets, at),
        )
        return response.status_code, None if response.is_success else response.text[:500]
    except Refused as exc:
        return None, f"refused: {exc}"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]


@dataclass(frozen=True)
class Outcome:
    """One attempt's answer: the receiver's status (None when none came), why it failed, and
    when the attempt ended."""

    item: Claimed
    status: int | None
    error: str | None
    at: datetime


def record(db: Database, settings: Settings, outcomes: list[Outcome]) -> None:
    """Commit a pass's outcomes in one transaction (one per delivery took the write lock
    from the API's group commits at every delivery)."""
    if not outcomes:
        return
    # not durable: an outcome lost in a crash only means the delivery is sent again
    with db.write(durable=False) as session:
        for outcome in outcomes:
            _recorded(session, settings, outcome)


def _recorded(session: Session, settings: Settings, outcome: Outcome) -> None:
    """One outcome, in the caller's transaction: delivered on a 2xx; else the next attempt
    after the back-off, or failed once the retry window has passed; the endpoint's failure
    count, and its disabling at `webhook_disable_after`."""
    now, status, error = outcome.at, outcome.status, outcome.error
    ok = status is not None and 200 <= status < 300
    delivery = session.get(WebhookDelivery, outcome.item.id)
    if delivery is None:  # its endpoint was deleted meanwhile
        return
    endpoint = session.get(WebhookEndpoint, delivery.endpoint_id)
    delivery.attempts += 1
    delivery.last_attempt_at, delivery.last_status, delivery.last_error = now, status, error
    if ok:
        delivery.status, delivery.delivered_at = DeliveryStatus.delivered, now
        LATENCY.observe((now - delivery.created_at).total_seconds())
        DELIVERIES.labels("delivered").inc()
        if endpoint is not None:
            endpoint.consecutive_failures = 0
        return
    if now - delivery.created_at >= timedelta(hours=settings.webhook_retry_hours):
        delivery.status = DeliveryStatus.failed
        DELIVERIES.labels("failed").inc()
    else:
        delivery.next_attempt_at = now + backoff(settings, delivery.attempts)
        DELIVERIES.labels("retry").inc()
    if endpoint is not None and endpoint.disabled_at is None:
        endpoint.consecutive_failures += 1
        if endpoint.consecutive_failures >= settings.webhook_disable_after:
            endpoint.disabled_at = now
            endpoint.disabled_reason = (
                f"{endpoint.consecutive_failures} consecutive failed attempts; last: "
                f"{status if status is not None else error}"
            )[:2000]
            DISABLED.inc()
            log.warning("webhook %s disabled: %s", endpoint.id, endpoint.disabled_reason)


def backoff(settings: Settings, attempts: int) -> timedelta:
    """base · 2^(attempts − 1), at most an hour, times a jitter in [½, 1)."""
    seconds = settings.webhook_backoff_seconds * 2 ** min(attempts - 1, 30)
    capped = min(seconds, MAX_BACKOFF.total_seconds())
    return timedelta(seconds=capped * (0.5 + random.random() / 2))


def send_due(db: Database, ring: Keyring, settings: Settings, client: httpx.Client) -> int:
    """One pass: claim what is due, send each, record the outcomes together; how many were
    sent."""
    lease = timedelta(seconds=settings.webhook_timeout_seconds * 3 + 5)
    claimed = claim(db, ring, lease, utcnow())
    outcomes = []
    try:
        for item in claimed:
            status, error = attempt(client, item)
            outcomes.append(Outcome(item, status, error, utcnow()))
    finally:  # what was sent is recorded even when a later send raised
        record(db, settings, outcomes)
    return len(claimed)


class Sender:
    """Runs `send_due` in one daemon thread until stopped: again at once while there was
    work, else every `webhook_poll_seconds`."""

    def __init__(self, db: Database, ring: Keyring, settings: Settings) -> None:
        self.db, self.ring, self.settings = db, ring, settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lethe-webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.settings.webhook_timeout_seconds + 5)

    def _loop(self) -> None:
        timeout = httpx.Timeout(self.settings.webhook_timeout_seconds)
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            while not self._stop.is_set():
                try:
                    sent = send_due(self.db, self.ring, self.settings, client)
                except Exception:  # a database hiccup: the next pass tries again
                    log.exception("webhook sender pass failed")
                    sent = 0
                if not sent:
                    self._stop.wait(self.settings.webhook_poll_seconds)
