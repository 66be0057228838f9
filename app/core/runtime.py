"""The resources one Lethe service works with, built once where it starts and passed in:
`create_app` builds one for the API, each worker (the embedded one, `lethe worker`) one
for its jobs. Nothing below them reads a process-wide configuration, so two services in one
process (tests, the embedded worker as a thread) share nothing but what their settings share
(one database URL: one engine pool; one configuration: one blob store)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from app.core.db.session import Database, database
from app.core.ledger.journal import Journal
from app.core.ledger.publish import Publisher
from app.core.settings import Settings
from app.core.storage.blobs import Blobs, blobs
from app.core.storage.crypto import Keyring, keyring


@dataclass(frozen=True)
class Runtime:
    """Settings, the database, the keyring of the master key, the blob store, the
    publisher of the log's checkpoints. (The pool that parses uploads is the API's own:
    `create_app` keeps it in the app's state.)"""

    settings: Settings
    db: Database
    keyring: Keyring
    blobs: Blobs
    publisher: Publisher

    @classmethod
    def build(cls, settings: Settings) -> Runtime:
        db, ring = database(settings.resolved_database_url), keyring(settings)
        return cls(
            settings=settings,
            db=db,
            keyring=ring,
            blobs=blobs(settings, ring),
            publisher=Publisher(db, settings),
        )

    @cached_property
    def journal(self) -> Journal:
        """This service's restore journal, found once (the database's identity is read, its
        journal's checked): the request path writes to it on every deletion."""
        return Journal.of(self.settings.resolved_journal_dir, self.db)
