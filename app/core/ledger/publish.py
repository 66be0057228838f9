"""Publishing the log's checkpoints through witnesses (C2SP tlog-witness).

The log signs a checkpoint of its newest tree head and asks each configured witness to
cosign it (`POST <prefix>/add-checkpoint` with the size the witness last cosigned and a
consistency proof from it). Only once a quorum of valid cosignatures came back is the
checkpoint, with them, stored as published: `/log/checkpoint` and `.tlog-proof` receipts use
published checkpoints only. A log that rewrites its history cannot publish (the witnesses
answer 409 or 422), so a rewrite needs the witnesses' keys too. With no witnesses configured
(the embedded default) every head is published as the log signed it."""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.core.db.session import Database
from app.core.db.tables import PublicNode, PublishedCheckpoint, TreeHead
from app.core.ledger import merkle, notes
from app.core.ledger.journal import Journal, sync_log
from app.core.ledger.notes import Checkpoint, NoteError, Verifier
from app.core.ledger.tiles import public_checkpoint, signed_checkpoint
from app.core.ledger.transparency import StoredNodes, signing_key
from app.core.settings import Settings

log = logging.getLogger("lethe.log")


class WitnessError(RuntimeError):
    """A witness refused or did not answer."""


@dataclass(frozen=True)
class Witness:
    url: str  # the submission prefix
    verifier: Verifier


def witnesses(settings: Settings) -> list[Witness]:
    out = []
    for entry in settings.log_witnesses:
        url, _, vkey = entry.strip().partition(" ")
        out.append(Witness(url.rstrip("/"), Verifier.parse(vkey)))
    return out


def latest_published(db: Database) -> PublishedCheckpoint | None:
    with db.read() as session:
        return session.scalar(
            select(PublishedCheckpoint).order_by(PublishedCheckpoint.tree_size.desc()).limit(1)
        )


def publish(
    db: Database, settings: Settings, clients: Mapping[str, httpx.Client] | None = None
) -> PublishedCheckpoint | None:
    """Publish the newest head if it is newer than the last published checkpoint and a quorum
    of witnesses cosigns it. Returns the newest published checkpoint. `clients` maps a
    witness URL to the HTTP client that reaches it (default: a plain request each time)."""
    last = latest_published(db)
    with db.read() as session:
        size = session.scalar(select(TreeHead.tree_size).order_by(TreeHead.tree_size.desc()))
        if not size or (last is not None and last.tree_size >= size):
            return last
        checkpoint = public_checkpoint(session, settings.log_origin)
    assert checkpoint is not None
    journal = Journal.of(settings.resolved_journal_dir, db.url)
    sync_log(db, journal)  # every certificate it covers outlives a restored backup
    note = signed_checkpoint(checkpoint, signing_key(settings))
    cosignatures: list[str] = []
    for witness in witnesses(settings):
        old = last.tree_size if last is not None else 0
        try:
            client = (clients or {}).get(witness.url)
            timeout = settings.witness_timeout_seconds
            cosignatures.append(ask(db, witness, note, checkpoint, old, timeout, client))
        except WitnessError as exc:
            log.warning("witness %s: %s", witness.verifier.name, exc)
    if len(cosignatures) < settings.witness_quorum:
        log.warning(
            "checkpoint %d not published: %d of %d cosignatures",
            checkpoint.size,
            len(cosignatures),
            settings.witness_quorum,
        )
        return last
    row = PublishedCheckpoint(
        tree_size=checkpoint.size,
        note=notes.with_signatures(note, cosignatures),
        cosigners=len(cosignatures),
    )
    try:
        with db.write() as session:
            session.add(row)
    except IntegrityError:  # another process published this size meanwhile
        pass
    sync_log(db, journal)
    return latest_published(db)


def ask(
    db: Database,
    witness: Witness,
    note: str,
    checkpoint: Checkpoint,
    old: int,
    timeout: float,
    client: httpx.Client | None = None,
) -> str:
    """The witness's verified cosignature line for `note`; a 409 naming the size the witness
    holds is answered once more with a proof from that size."""
    for _ in range(2):
        body = f"old {old}\n" + "".join(f"{h}\n" for h in _proof(db, old, checkpoint.size))
        try:
            post = client.post if client is not None else httpx.post
            answer = post(
                f"{witness.url}/add-checkpoint",
                content=(body + "\n" + note).encode(),
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            raise WitnessError(f"unreachable: {exc}") from exc
        if answer.status_code == 409 and answer.headers.get("content-type", "").startswith(
            "text/x.tlog.size"
        ):
            held = answer.text.strip()
            if not held.isdigit() or int(held) > checkpoint.size or int(held) == old:
                raise WitnessError(f"409: it holds a checkpoint of size {held[:20]}")
            old = int(held)
            continue
        if answer.status_code != 200:
            raise WitnessError(f"{answer.status_code}: {answer.text[:200]}")
        for line in answer.text.splitlines():
            try:
                opened = notes.open_note(notes.with_signatures(note, [line]), [witness.verifier])
            except NoteError:
                continue
            if witness.verifier.name in opened.signed_by:
                return line + "\n"
        raise WitnessError("its answer holds no valid cosignature by its key")
    raise WitnessError("it keeps answering 409")


def _proof(db: Database, old: int, new: int) -> list[str]:
    if old == 0 or old == new:
        return []
    with db.read() as session:
        nodes = StoredNodes(session, PublicNode)
        path = merkle.consistency_path(old, new, nodes.subtree)
    return [base64.b64encode(h).decode() for h in path]


def current_checkpoint(db: Database, settings: Settings) -> PublishedCheckpoint | None:
    """The checkpoint to serve: the newest published one; with no witnesses configured the
    newest head is published first (it needs nobody's cosignature)."""
    return latest_published(db) if settings.log_witnesses else publish(db, settings)


class Publisher:
    """One service's publication of checkpoints (one trigger, no module registry):
    `now` publishes, logging instead of raising (maintenance calls it every period, for a head
    the witnesses missed); `soon`, after a commit, publishes in a background thread at most
    once per `checkpoint_interval_seconds`; `finish`, at a clean stop, runs what is scheduled
    and waits for what is under way."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db, self.settings = db, settings
        self._publishing = threading.Lock()
        self._scheduling = threading.Lock()
        self._pending: threading.Timer | None = None  # the publication scheduled
        self._last = -math.inf  # when the last scheduled publication started
        self._timers: list[threading.Timer] = []  # not yet joined

    def now(self) -> None:
        """`publish`, logging instead of raising."""
        try:
            with self._publishing:
                publish(self.db, self.settings)
        except Exception:
            log.warning("publishing a checkpoint failed; maintenance retries", exc_info=True)

    def soon(self) -> None:
        """Publish in a background thread, at most once per `checkpoint_interval_seconds`: a
        head committed while a publication is scheduled is published by it, one committed just
        after a publication waits for the next. A slow or unreachable witness never delays the
        worker's next update, and twenty updates a second make one checkpoint a second, not
        twenty (publishing after every update competed with the next one)."""
        with self._scheduling:
            if self._pending is not None:
                return
            wait = max(0.0, self._last + self.settings.checkpoint_interval_seconds)
            timer = threading.Timer(max(0.0, wait - time.monotonic()), self._scheduled)
            timer.name, timer.daemon = "lethe-publish", True
            self._pending = timer
            self._timers = [*(t for t in self._timers if t.is_alive()), timer]
            timer.start()

    def finish(self) -> None:
        """At a clean stop, after the workers stopped: a publication still scheduled runs now
        and every one under way is waited for, so the last head is published and no background
        thread holds a database connection once the service has stopped (an embedded SQLite
        database's WAL is then checkpointed and removed as its last connection closes)."""
        with self._scheduling:
            self._pending = None
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()  # not yet started: it never runs; under way: it finishes
            timer.join()
        if timers:
            self.now()

    def _scheduled(self) -> None:
        with self._scheduling:
            self._pending = None
            self._last = time.monotonic()
        self.now()
