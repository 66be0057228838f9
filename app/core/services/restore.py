"""Telling and repairing a database restored from a backup: a restore must never
bring an erased person back, nor make the log sign a second tree at a published size.

`verdict` compares the database with the journal (app/core/ledger/journal.py): a journaled
certificate, tree head, checkpoint or deletion request the database lacks means it was rolled
back (`behind`): the service is then not ready and starts no worker until `lethe restore`
ran. `restore` puts the log back as published (the journal's certificates, heads and
checkpoints, verbatim: nothing is re-signed), keeps the lost requests' ids as stubs (no id is
given twice), and re-applies every lost erasure with new deletion requests through the usual
pipeline (rows, keys, blobs, models unlearned or retrained). Until those are done the service
is `restoring`: ready for nothing but health, metrics and reading deletions.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.orm import Session

from app.core.db.session import Database
from app.core.db.tables import (
    Certificate,
    Dataset,
    DatasetAppend,
    DeletionRequest,
    Model,
    PublicNode,
    PublishedCheckpoint,
    Sample,
    Suppression,
    TreeHead,
    utcnow,
)
from app.core.ledger import deployment
from app.core.ledger.journal import Journal, sync_log
from app.core.ledger.transparency import StoredNodes, public_entry
from app.core.schemas import DeletionCreate
from app.core.services.deletions import Names, create_deletion
from app.core.services.suppression import Entry, lift_token, put_tokens
from app.core.settings import Settings
from app.core.states import DatasetStatus, RequestStatus, SampleStatus
from app.core.storage.crypto import Keyring

log = logging.getLogger("lethe.restore")
FINISHED = (RequestStatus.done, RequestStatus.failed)


def journal_of(settings: Settings) -> Journal:
    return Journal.of(settings.resolved_journal_dir, settings.resolved_database_url)


def adopt_journal(db: Database, journal_dir: Path, source: Path) -> None:
    """`lethe restore --journal`: the journal the operator points at becomes this database's
    (copied into its place), if it journaled this database or predates deployment ids."""
    import shutil

    identity = deployment.ensure(db, journal_dir)
    found = deployment.journal_identity(source)
    if found is not None and found.get("deployment_id") != identity.deployment_id:
        raise ValueError(f"the journal in {source} belongs to another database")
    target = deployment.folder_of(journal_dir, identity)
    if source.resolve() != target.resolve():
        shutil.copytree(source, target, dirs_exist_ok=True)
    (target / deployment.IDENTITY).unlink(missing_ok=True)
    deployment.write_identity(target, identity)


def new_deployment(db: Database, journal_dir: Path) -> Journal:
    """`lethe restore --new-deployment`: this copy lives on alone, under a new identity, with
    a journal of its own seeded from what it holds (its requests, its log). Its log goes on
    from its own tree: the original must not go on too, or the two logs differ."""
    identity = deployment.renew(db)
    folder = deployment.folder_of(journal_dir, identity)
    deployment.write_identity(folder, identity)
    journal = Journal(folder)
    with db.read() as session:
        for request in session.scalars(select(DeletionRequest).order_by(DeletionRequest.id)):
            listed = session.execute(
                select(
                    Suppression.kind,
                    Suppression.token,
                    Suppression.any_case,
                    Suppression.via_subject,
                ).where(Suppression.request_id == request.id)
            )
            journal.record_request(
                request.id,
                request.dataset_id,
                list(request.sample_ids or []),
                list((request.selector or {}).get("sample_ids", [])),
                list((request.selector or {}).get("subject_ids", [])),
                [Entry(k, t, bool(a), v).as_json() for k, t, a, v in listed],
            )
        highest = {
            "datasets": session.scalar(select(func.max(Dataset.id))) or 0,
            "appends": session.scalar(select(func.max(DatasetAppend.id))) or 0,
        }
    journal.record_ids(**highest)
    sync_log(db, journal)
    return journal


@dataclass(frozen=True)
class Verdict:
    """`ok`; `behind`: restored from a backup, `lethe restore` must run; `restoring`: the
    restore's deletions are still running."""

    state: Literal["ok", "behind", "restoring"]
    reason: str = ""
    requests: list[int] = field(default_factory=list)  # `restoring`: the ones to wait for


def verdict(db: Database, journal: Journal, journal_dir: Path | None = None) -> Verdict:
    """Whether the database is behind the journal (or its journal is missing, or another
    database's), or still re-applying a restore."""
    mismatch = deployment.problem(db, journal_dir or journal.folder.parent)
    if mismatch is not None:
        return Verdict("behind", mismatch)
    marks = journal.marks()
    logged, checkpoints = marks["certificate"], marks["checkpoint"]
    requests: dict[int, dict[str, Any]] = {}
    restores: list[dict[str, Any]] = []
    for entry in journal.erasures():
        if entry["type"] == "request":
            requests[entry["request_id"]] = entry
        else:
            restores.append(entry)
    if restores and restores[-1]["type"] == "restore_begun":
        return Verdict("behind", "a restore began and did not finish: run `lethe restore` again")
    with db.read() as session:
        size = session.scalar(select(func.max(Certificate.seq))) or 0
        published = session.scalar(select(func.max(PublishedCheckpoint.tree_size))) or 0
        present = _present_requests(session, list(requests))
        if size < logged or published < checkpoints:
            return Verdict(
                "behind",
                f"the database's log holds {size} certificates and {published} published; "
                f"the journal {logged} and {checkpoints}: it was restored from a backup",
            )
        missing = sorted(set(requests) - present)
        if missing:
            return Verdict(
                "behind",
                f"{len(missing)} accepted deletion request(s) are missing from the database "
                f"(first {missing[:5]}): it was restored from a backup",
            )
        if restores:  # the last one is done (`restore`)
            waiting = _unfinished(session, restores[-1]["requests"])
            if waiting:
                return Verdict(
                    "restoring", f"re-applying {len(waiting)} erasure(s) after a restore", waiting
                )
    return Verdict("ok")


def still_restoring(db: Database, requests: list[int]) -> list[int]:
    with db.read() as session:
        return _unfinished(session, requests)


@dataclass(frozen=True)
class RestoreReport:
    certificates: int  # put back from the journal
    heads: int
    checkpoints: int
    lost_requests: list[int]  # journaled, missing from the database
    new_requests: list[int]  # made to re-apply their erasures
    samples: int  # rows found active that had been erased
    size: int  # the log's size once put back

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def restore(db: Database, ring: Keyring, journal: Journal) -> RestoreReport:
    """Put the log back as the journal has it, keep the lost requests' ids, and re-apply
    their erasures through new deletion requests. Idempotent: a second run finds nothing."""
    entries = list(journal.log_entries())
    requests = {e["request_id"]: e for e in journal.erasures() if e["type"] == "request"}
    journal.record_restore_begun()  # until it is done, a start finds the database behind
    with db.write() as session:
        restored = _restore_log(session, entries)
        _restore_suppressions(session, journal)
    with db.write() as session:
        lost = sorted(set(requests) - _present_requests(session, list(requests)))
        # every journaled request's rows, not only the lost ones': a restore that stopped
        # half-way left stubs, and its rerun must still find their rows
        rows = _still_active(session, list(requests.values()))
        _keep_ids(session, [requests[i] for i in lost])  # before any new id is given
        _continue_ids(session, journal.id_marks(), entries)
    made: list[int] = []
    for dataset_id, tokens in rows.items():
        for chunk in (tokens[i : i + 10_000] for i in range(0, len(tokens), 10_000)):
            with db.write() as session:
                body = DeletionCreate(dataset_id=dataset_id, sample_ids=chunk)
                names = Names({t: t for t in chunk}, {})
                accepted = create_deletion(
                    session, ring, body, names, None, None, True, suppressing=False
                )
                made.append(accepted.request.id)
    with db.write() as session:
        note = f"lost when the database was restored from a backup; re-applied by {made}"
        for request_id in lost:
            stub = session.get(DeletionRequest, request_id)
            if stub is not None:
                stub.error = note
        size = session.scalar(select(func.max(Certificate.seq))) or 0
    journal.record_restore(lost, made, size)
    report = RestoreReport(*restored, lost, made, sum(len(t) for t in rows.values()), size)
    log.warning("restore: %s", json.dumps(report.as_json()))
    return report


def _restore_suppressions(session: Session, journal: Journal) -> None:
    """The suppression list as the journal has it: every token a request put on it, in order,
    and every lift after (a backup older than an erasure must not let its person back in)."""
    for entry in journal.erasures():
        if entry["type"] == "request":
            made = [
                Entry(s["kind"], s["token"], bool(s.get("any_case", False)), s.get("via"))
                for s in entry.get("suppressed", [])
            ]
            put_tokens(session, made, entry["request_id"])
        elif entry["type"] == "lift":
            lift_token(session, entry["token"], "lifted before the restore", None)


def _restore_log(session: Session, entries: list[dict[str, Any]]) -> tuple[int, int, int]:
    """Insert the journal's certificates, heads and checkpoints the database lacks, and the
    tree nodes their leaves complete; nothing is signed."""
    size = session.scalar(select(func.max(Certificate.seq))) or 0
    top_head = session.scalar(select(func.max(TreeHead.tree_size))) or 0
    have = set(session.scalars(select(PublishedCheckpoint.tree_size)))
    by_seq = {e["seq"]: e for e in entries if e["type"] == "certificate" and e["seq"] > size}
    certificates = [by_seq[seq] for seq in sorted(by_seq)]
    heads = list(
        {
            e["tree_size"]: e for e in entries if e["type"] == "head" and e["tree_size"] > top_head
        }.values()
    )
    checkpoints = list(
        {
            e["tree_size"]: e
            for e in entries
            if e["type"] == "checkpoint" and e["tree_size"] not in have
        }.values()
    )
    if certificates:
        _restore_certificates(session, certificates)
    if heads:
        session.execute(
            insert(TreeHead), [{k: v for k, v in e.items() if k != "type"} for e in heads]
        )
    if checkpoints:
        session.execute(
            insert(PublishedCheckpoint),
            [
                {
                    **{k: v for k, v in e.items() if k != "type"},
                    "created_at": datetime.fromisoformat(e["created_at"]),
                }
                for e in checkpoints
            ],
        )
    return len(certificates), len(heads), len(checkpoints)


def _restore_certificates(session: Session, certificates: list[dict[str, Any]]) -> None:
    """The journal's certificates inserted (the auditors' openings are not journaled) and the
    log's tree nodes, private and public, that their leaves complete."""
    rows = [
        {
            **{k: v for k, v in e.items() if k != "type"},
            "created_at": datetime.fromisoformat(e["created_at"]),
            "restricted": None,
        }
        for e in certificates
    ]
    session.execute(insert(Certificate), rows)
    nodes, public = StoredNodes(session), StoredNodes(session, PublicNode)
    for e in certificates:
        nodes.add_leaf(e["seq"] - 1, e["body"].encode())
        public.add_leaf(e["seq"] - 1, public_entry(e["body"]))
    nodes.write()
    public.write()
    _advance_sequences(session)


def _present_requests(session: Session, ids: list[int]) -> set[int]:
    found: set[int] = set()
    for i in range(0, len(ids), 10_000):
        chunk = ids[i : i + 10_000]
        found.update(
            session.scalars(select(DeletionRequest.id).where(DeletionRequest.id.in_(chunk)))
        )
    return found


def _unfinished(session: Session, ids: list[int]) -> list[int]:
    if not ids:
        return []
    return sorted(
        session.scalars(
            select(DeletionRequest.id).where(
                DeletionRequest.id.in_(ids), DeletionRequest.status.not_in(FINISHED)
            )
        )
    )


def _still_active(session: Session, lost: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Per dataset, the tokens of the lost requests' samples the database holds unerased and
    no request of its own is erasing: each one an erased person come back."""
    pending: set[int] = set()
    for ids in session.scalars(
        select(DeletionRequest.sample_ids).where(DeletionRequest.status.not_in(FINISHED))
    ):
        pending.update(ids)
    out: dict[int, list[str]] = {}
    for entry in lost:
        wanted = [i for i in entry["sample_ids"] if i not in pending]
        for i in range(0, len(wanted), 10_000):
            found = session.scalars(
                select(Sample.external_id).where(
                    Sample.id.in_(wanted[i : i + 10_000]),
                    Sample.dataset_id == entry["dataset_id"],
                    Sample.status != SampleStatus.erased,
                )
            )
            out.setdefault(entry["dataset_id"], []).extend(found)
    return {k: sorted(set(v)) for k, v in out.items() if v}


def _keep_ids(session: Session, lost: list[dict[str, Any]]) -> None:
    """A stub for each lost request, so its id answers and is never given again, and the
    id sequences past every id the database now holds (PostgreSQL)."""
    now = utcnow()
    note = "lost when the database was restored from a backup"
    datasets = set(session.scalars(select(Sample.dataset_id).distinct()))
    for entry in lost:
        if entry["dataset_id"] not in datasets:
            continue  # the dataset itself was lost: nothing of it is served
        tokens = {"sample_ids": entry["sample_tokens"], "subject_ids": entry["subject_tokens"]}
        session.add(
            DeletionRequest(
                id=entry["request_id"],
                dataset_id=entry["dataset_id"],
                fingerprint=hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
                selector=tokens,
                sample_ids=entry["sample_ids"],
                already_erased=[],
                status=RequestStatus.done,
                error=note,
                created_at=now,
                updated_at=now,
                finished_at=now,
            )
        )
    session.flush()
    _advance_sequences(session)


def _continue_ids(session: Session, marks: dict[str, int], entries: list[dict[str, Any]]) -> None:
    """Dataset and append ids continue past the highest the journal saw given (a placeholder
    row, failed and saying why, holds the highest lost one: SQLite gives max + 1), and each
    model's version numbers past the highest its journaled certificates published."""
    note = {"code": "lost_in_restore", "message": LOST}
    top = session.scalar(select(func.max(Dataset.id))) or 0
    if marks.get("datasets", 0) > top:
        session.add(
            Dataset(
                id=marks["datasets"], name="(lost in a restore)", kind="", source="lost",
                feature_shape=[], n_classes=0, n_samples=0, status=DatasetStatus.failed,
                error=note,
            )
        )  # fmt: skip
        session.flush()
    top_append = session.scalar(select(func.max(DatasetAppend.id))) or 0
    if marks.get("appends", 0) > top_append:
        owner = session.get(Dataset, marks.get("append_dataset", 0))
        session.add(
            DatasetAppend(
                id=marks["appends"],
                dataset_id=owner.id if owner is not None else marks.get("datasets", top),
                source="lost",
                status=DatasetStatus.failed,
                error=note,
            )
        )
        session.flush()
    published: dict[int, int] = {}
    for e in entries:
        if e["type"] == "certificate" and e.get("to_version") is not None:
            model = e["model_id"]
            published[model] = max(published.get(model, 0), int(e["to_version"]))
    for model_id, number in published.items():
        session.execute(
            update(Model)
            .where(Model.id == model_id, Model.version_floor < number)
            .values(version_floor=number)
        )
    _advance_sequences(session)


LOST = "lost when the database was restored from a backup; its id is not given again"


def _advance_sequences(session: Session) -> None:
    """PostgreSQL's id sequences past the ids now held (SQLite takes max + 1 itself)."""
    if session.get_bind().dialect.name == "postgresql":
        for table in ("deletion_requests", "certificates", "datasets", "dataset_appends"):
            session.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"GREATEST((SELECT COALESCE(MAX(id), 1) FROM {table}), 1))"
                )
            )
