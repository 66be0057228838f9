"""The restore journal: what a restored database backup must not undo, kept apart from the
database, in `journal_dir` (by default outside the data folder: a backup of that folder does not
restore it), in a folder named for the database's deployment (app/core/ledger/deployment.py).
Two append-only JSON-lines files and a marks file:

- `erasures.jsonl`: every accepted deletion request, as its dataset, its internal sample ids
  and the keyed tokens of the ids it named (never a raw id), written once the request commits
  and before it is acknowledged; and a line for each restore.
- `log.jsonl`: every certificate (its logged body and columns, not the auditors' restricted
  values), signed tree head and published checkpoint, in order, written before a checkpoint is
  published: the log can then continue from the published tree without signing another.

A database behind the journal (a journaled certificate it lacks, or a journaled erasure whose
rows it holds active with no request pending for them) was restored from a backup:
`app/core/services/restore.py` tells and repairs it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.core.db.session import Database, database
from app.core.db.tables import Certificate, PublishedCheckpoint, TreeHead
from app.core.ledger import deployment

ERASURES, LOG, LAST, IDS = "erasures.jsonl", "log.jsonl", "log.marks", "ids.json"

# each kind of log line and the field its mark follows
MARKED = {"certificate": "seq", "head": "tree_size", "checkpoint": "tree_size"}


@dataclass(frozen=True)
class Journal:
    """The journal's folder; every write appends a line and fsyncs it under a file lock."""

    folder: Path

    @classmethod
    def of(cls, journal_dir: Path, db: Database | str) -> Journal:
        """The journal of one database: the folder named for its deployment
        (app/core/ledger/deployment.py), so the database finds it wherever it is restored to."""
        found = database(db) if isinstance(db, str) else db
        # read each time (one row by its key): a database emptied or replaced under the
        # same URL has another identity, and must not write into the journal of the last
        return cls(deployment.folder_of(journal_dir, deployment.ensure(found, journal_dir)))

    def record_request(
        self,
        request_id: int,
        dataset_id: int,
        sample_ids: list[int],
        sample_tokens: list[str],
        subject_tokens: list[str],
        suppressed: list[dict[str, Any]] | None = None,
    ) -> None:
        """An accepted deletion request, durable before it is acknowledged, with the
        suppression tokens it put on the list (a restore puts them back)."""
        entry = {
            "type": "request",
            "request_id": request_id,
            "dataset_id": dataset_id,
            "sample_ids": sample_ids,
            "sample_tokens": sample_tokens,
            "subject_tokens": subject_tokens,
            "suppressed": suppressed or [],
        }
        with self._locked():
            self._append(ERASURES, [entry])

    def record_lift(self, token: str) -> None:
        """A suppression lifted (the reason stays in the database): a restore keeps it
        lifted."""
        with self._locked():
            self._append(ERASURES, [{"type": "lift", "token": token}])

    def record_restore_begun(self) -> None:
        """A restore starts: a start before its `record_restore` finds the database behind."""
        with self._locked():
            self._append(ERASURES, [{"type": "restore_begun"}])

    def record_restore(self, handled: list[int], requests: list[int], size: int) -> None:
        """A restore: the journaled request ids it found missing and re-applied, the requests
        it made to do so, and the log size it continued from."""
        entry = {"type": "restore", "handled": handled, "requests": requests, "size": size}
        with self._locked():
            self._append(ERASURES, [entry])

    def record_ids(self, **given: int) -> None:
        """The highest dataset or append id given so far (`datasets=7`), before a client or a
        webhook is told it: a restore continues past them, so no id names two things."""
        with self._locked():
            marks = self.id_marks()
            merged = {k: max(v, marks.get(k, 0)) for k, v in given.items()}
            if any(marks.get(k, 0) < v for k, v in merged.items()):
                deployment.write_atomically(self.folder / IDS, json.dumps(marks | merged).encode())

    def id_marks(self) -> dict[str, int]:
        try:
            found: dict[str, int] = json.loads((self.folder / IDS).read_text())
        except FileNotFoundError:
            return {}
        return found

    def erasures(self) -> Iterator[dict[str, Any]]:
        yield from self._read(ERASURES)

    def log_entries(self) -> Iterator[dict[str, Any]]:
        yield from self._read(LOG)

    def marks(self) -> dict[str, int]:
        """The largest certificate seq, tree-head size and published-checkpoint size the
        journal holds (0 when none): a small file, so a sync reads no history."""
        try:
            found = json.loads((self.folder / LAST).read_text())
        except FileNotFoundError:
            found = {}
        return {kind: int(found.get(kind, 0)) for kind in MARKED}

    def append_log(self, lines: list[dict[str, Any]]) -> None:
        """Certificates, heads and checkpoints past the marks (under the lock: two processes
        syncing at once journal each line once), then the new marks."""
        with self._locked():
            marks = self.marks()
            fresh = [line for line in lines if line[MARKED[line["type"]]] > marks[line["type"]]]
            self._append(LOG, fresh)
            for line in fresh:
                marks[line["type"]] = max(marks[line["type"]], line[MARKED[line["type"]]])
            if fresh:
                deployment.write_atomically(self.folder / LAST, json.dumps(marks).encode())

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time across processes (the API, the worker, the CLI)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _append(self, name: str, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        data = "".join(json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n" for e in entries)
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read(self, name: str) -> Iterator[dict[str, Any]]:
        path = self.folder / name
        if not path.exists():
            return
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.endswith("\n"):  # a line cut by a crash mid-write is not an entry
                    yield json.loads(line)


def sync_log(db: Database, journal: Journal) -> None:
    """Journal every certificate, tree head and published checkpoint past the journal's marks:
    run before a checkpoint is published, and after."""
    marks = journal.marks()
    with db.read() as session:
        certificates = session.scalars(
            select(Certificate).where(Certificate.seq > marks["certificate"]).order_by("seq")
        )
        lines = [certificate_line(c) for c in certificates]
        heads = session.scalars(
            select(TreeHead).where(TreeHead.tree_size > marks["head"]).order_by("tree_size")
        )
        lines += [head_line(h) for h in heads]
        checkpoints = session.scalars(
            select(PublishedCheckpoint)
            .where(PublishedCheckpoint.tree_size > marks["checkpoint"])
            .order_by("tree_size")
        )
        lines += [checkpoint_line(c) for c in checkpoints]
    if lines:
        journal.append_log(lines)


def certificate_line(row: Any) -> dict[str, Any]:
    """A certificate as the journal keeps it: what the log hashed and its indexed columns."""
    return {
        "type": "certificate",
        "id": row.id,
        "seq": row.seq,
        "request_id": row.request_id,
        "model_id": row.model_id,
        "from_version": row.from_version,
        "to_version": row.to_version,
        "method": row.method,
        "guarantee": row.guarantee,
        "epsilon": row.epsilon,
        "delta": row.delta,
        "cumulative_epsilon": row.cumulative_epsilon,
        "cumulative_delta": row.cumulative_delta,
        "n_removed": row.n_removed,
        "body": row.body,
        "created_at": row.created_at.isoformat(),
        "prev_hash": row.prev_hash,
        "entry_hash": row.entry_hash,
    }


def head_line(row: Any) -> dict[str, Any]:
    return {
        "type": "head",
        "tree_size": row.tree_size,
        "root_hash": row.root_hash,
        "timestamp": row.timestamp,
        "key_id": row.key_id,
        "signature": row.signature,
    }


def checkpoint_line(row: Any) -> dict[str, Any]:
    return {
        "type": "checkpoint",
        "tree_size": row.tree_size,
        "note": row.note,
        "cosigners": row.cosigners,
        "created_at": row.created_at.isoformat(),
    }
