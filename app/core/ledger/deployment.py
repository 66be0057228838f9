"""The database's identity and its restore journal's (docs/design/restore-journal.md).

The database keeps one `deployment` row: its own id and its journal's. The journal's folder is
named for the deployment (`<journal_dir>/<deployment id>`) and holds `identity.json` naming
both. So a database copied into another folder or URL still finds its journal, and a start
whose journal is missing, or belongs to another database, is not ready until an operator runs
`lethe restore` (app/core/services/restore.py) instead of forking the log.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import exists, make_url, select, update
from sqlalchemy.dialects import postgresql, sqlite

from app.core.db.session import Database
from app.core.db.tables import Certificate, Dataset, DeletionRequest, Deployment, utcnow

log = logging.getLogger("lethe.restore")
IDENTITY = "identity.json"


@dataclass(frozen=True)
class Identity:
    """A database's deployment id and the id of the journal it was journaled to."""

    deployment_id: str
    journal_id: str | None


def read(db: Database) -> Identity | None:
    with db.read() as session:
        row = session.get(Deployment, 1)
        return None if row is None else Identity(row.deployment_id, row.journal_id)


def has_history(db: Database) -> bool:
    """Whether anything a journal keeps could have happened here: a dataset, a request or a
    certificate."""
    with db.read() as session:
        return bool(
            session.scalar(
                select(
                    exists(select(Dataset.id))
                    | exists(select(DeletionRequest.id))
                    | exists(select(Certificate.id))
                )
            )
        )


def folder_of(journal_dir: Path, identity: Identity) -> Path:
    return journal_dir / identity.deployment_id


def legacy_folder(journal_dir: Path, url: str) -> Path:
    """Where a journal lived before deployment ids: a folder named for the database's URL."""
    where = make_url(url).render_as_string(hide_password=True)
    return journal_dir / hashlib.sha256(where.encode()).hexdigest()[:16]


def ensure(db: Database, journal_dir: Path) -> Identity:
    """This database's identity, made on its first start, and its journal's folder: the
    journal kept before deployment ids adopted (the folder named for this URL), or a new one
    (for a database with no history, or one started for the first time since deployment
    ids, whose journal cannot be told apart from none). A database that has its identity and
    whose journal is not found is left without one: `problem` says so and the service stays
    shut until `lethe restore`."""
    found = read(db)
    first_start = found is None  # of this database, or of it since deployment ids
    if found is None:
        made = Identity(str(uuid.uuid4()), str(uuid.uuid4()))
        with db.write() as session:  # two processes starting at once: the first one's
            dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
            session.execute(
                dialect.insert(Deployment)
                .values(
                    id=1,
                    deployment_id=made.deployment_id,
                    journal_id=made.journal_id,
                    created_at=utcnow(),
                )
                .on_conflict_do_nothing(index_elements=["id"])
            )
        found = read(db)
        assert found is not None
    folder = folder_of(journal_dir, found)
    if journal_identity(folder) is not None:
        return found
    legacy = legacy_folder(journal_dir, db.url)
    if legacy.is_dir() and any(legacy.iterdir()):
        with contextlib.suppress(OSError):  # another process adopted it first
            legacy.rename(folder)
        log.warning(
            "the restore journal in %s is now %s (named for the deployment)", legacy, folder
        )
        write_identity(folder, found)
    elif first_start or not has_history(db):
        if first_start and has_history(db):  # a database from before deployment ids
            log.warning(
                "no restore journal was found for this database's history; one starts now in "
                "%s (a backup from before now cannot be told from it)",
                folder,
            )
        write_identity(folder, found)
    return found


def write_identity(folder: Path, identity: Identity) -> None:
    """The journal's side: which database it journals (written once, atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / IDENTITY
    if path.exists():
        return
    data = {"deployment_id": identity.deployment_id, "journal_id": identity.journal_id}
    write_atomically(path, json.dumps(data).encode())


def write_atomically(path: Path, data: bytes) -> None:
    """`data` as the whole of `path`, fsynced, in place at once (a temporary file of this
    process renamed over it): a reader finds the old file or the new, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def journal_identity(folder: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads((folder / IDENTITY).read_text())
    except FileNotFoundError:
        return None
    return found


def problem(db: Database, journal_dir: Path) -> str | None:
    """Why this database and the journal found for it do not belong together, or None."""
    identity = read(db)
    if identity is None:
        return None  # not started yet: `ensure` makes both
    folder = folder_of(journal_dir, identity)
    found = journal_identity(folder)
    if found is None:
        return (
            f"the restore journal of this database ({folder}) is missing: it was copied or "
            "restored without it. Put the journal back there, or run `lethe restore --journal "
            "<folder>`; if this copy is to live on alone, `lethe restore --new-deployment`"
        )
    if found.get("deployment_id") != identity.deployment_id or (
        identity.journal_id is not None and found.get("journal_id") != identity.journal_id
    ):
        return f"the restore journal in {folder} belongs to another database"
    return None


def renew(db: Database) -> Identity:
    """A new deployment id and journal id for this database (`lethe restore
    --new-deployment`): a copy that lives on alone, with a journal of its own."""
    made = Identity(str(uuid.uuid4()), str(uuid.uuid4()))
    with db.write() as session:
        session.execute(
            update(Deployment)
            .where(Deployment.id == 1)
            .values(deployment_id=made.deployment_id, journal_id=made.journal_id)
        )
    return made
