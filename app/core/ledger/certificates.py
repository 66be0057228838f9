"""The certificate hash chain: canonical JSON, append, verify, export.

entry_hash = sha256(prev_hash + "\\n" + body), body the canonical JSON of the certificate's
fields. prev_hash and seq are unique columns, so two writers can never fork the chain: the
loser's insert fails and its transaction is retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Table, event, func, select
from sqlalchemy.orm import Session

from app.core.db.bulk import insert_together
from app.core.db.tables import Certificate, TreeHead, utcnow
from app.core.jsontypes import JsonObject, as_object, optional_object
from app.core.ledger import transparency
from app.privacy.lineage import LineageEvent, history_from_certificates

GENESIS = "0" * 64
# Columns duplicated out of the body for queries; verification checks they still agree.
INDEXED_FIELDS = (
    "seq",
    "request_id",
    "model_id",
    "from_version",
    "to_version",
    "method",
    "guarantee",
    "epsilon",
    "delta",
    "cumulative_epsilon",
    "cumulative_delta",
    "n_removed",
)


def canonical_json(doc: JsonObject) -> str:
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def chain_hash(prev_hash: str, body: str) -> str:
    return hashlib.sha256(f"{prev_hash}\n{body}".encode()).hexdigest()


COMMITMENT_SCHEME = "HMAC-SHA256(opening, sorted removed ids joined by newlines)"


def removed_ids_commitment(opening: bytes, external_ids: list[str]) -> str:
    """A commitment to the removed ids that only the holder of `opening` can check.

    A salted hash beside its salt could be reversed by hashing candidate ids; an HMAC under a
    256-bit key returned to the requester alone, whose server copy is destroyed once the
    request is done, cannot: without the opening every candidate set is equally likely."""
    joined = "\n".join(sorted(external_ids)).encode()
    return hmac.new(opening, joined, hashlib.sha256).hexdigest()


def commitment_holds(opening_hex: str, external_ids: list[str], commitment: str) -> bool:
    """Whether `commitment` is the one these ids give under this opening (constant time)."""
    try:
        opening = bytes.fromhex(opening_hex)
    except ValueError:
        return False
    return hmac.compare_digest(removed_ids_commitment(opening, external_ids), commitment)


RESTRICTED = "_restricted"  # the fields key of the restricted constants (never in the body)


def constant_commitment(salt: str, value: Any) -> str:
    """sha256(salt ‖ "\n" ‖ canonical JSON of the value): what the body shows of a
    restricted constant; an auditor given (value, salt) recomputes it."""
    return hashlib.sha256(f"{salt}\n{canonical_json({'value': value})}".encode()).hexdigest()


def disclosed(document: JsonObject, restricted: str | None) -> JsonObject:
    """A certificate document with its restricted constants' values filled in, each with the
    salt of its commitment: for auditors and admins only."""
    if not restricted:
        return document
    sealed = json.loads(restricted)
    constants = dict(as_object(document.get("constants", {})))
    for name, entry in sealed.get("constants", {}).items():
        if name in constants:
            shown = as_object(constants[name])
            constants[name] = {**shown, "value": entry["value"], "salt": entry["salt"]}
    fields = {name: entry["value"] for name, entry in sealed.get("fields", {}).items()}
    salts = {name: entry["salt"] for name, entry in sealed.get("fields", {}).items()}
    extra = {"restricted_salts": salts} if salts else {}
    return {**document, **fields, **extra, "constants": constants}


def _nonempty(restricted: JsonObject | None) -> JsonObject | None:
    """The restricted part when it holds anything."""
    if not restricted or not any(restricted.get(part) for part in ("constants", "fields")):
        return None
    return restricted


def certificate_documents(
    session: Session, model_id: int, disclose: bool = False
) -> list[JsonObject]:
    """A model's certificates as documents, in chain order (`disclose`: with the restricted
    constants' values, for auditors and admins)."""
    rows = session.execute(
        select(Certificate.body, Certificate.restricted)
        .where(Certificate.model_id == model_id)
        .order_by(Certificate.seq)
    ).all()
    return [
        disclosed(json.loads(body), restricted if disclose else None) for body, restricted in rows
    ]


def recent_certificate_documents(
    session: Session, model_id: int, limit: int, disclose: bool = False
) -> list[JsonObject]:
    """A model's last `limit` certificates as documents, oldest first (`disclose`: with the
    restricted values, for auditors and admins)."""
    rows = session.execute(
        select(Certificate.body, Certificate.restricted)
        .where(Certificate.model_id == model_id)
        .order_by(Certificate.seq.desc())
        .limit(limit)
    ).all()
    return [
        disclosed(json.loads(body), restricted if disclose else None)
        for body, restricted in reversed(rows)
    ]


def lineage_history(session: Session, model_id: int) -> list[LineageEvent]:
    """Every noisy release since the model's last exact retrain, from the log: the one rule
    the worker's admission and the preview share (one document per version)."""
    return history_from_certificates(release_documents(session, model_id))


def release_documents(session: Session, model_id: int) -> list[JsonObject]:
    """The first certificate of each of a model's versions, in chain order.

    Coalesced requests share one release and carry the same privacy fields, so the lineage's
    history needs one document per version: O(versions) JSON to decode per update, not
    O(requests) (that decoding was 11% of a worker's time at 2,000 requests, and growing).
    """
    first = (
        select(func.min(Certificate.seq))
        .where(Certificate.model_id == model_id)
        .group_by(Certificate.to_version)
    )
    bodies = session.scalars(
        select(Certificate.body).where(Certificate.seq.in_(first)).order_by(Certificate.seq)
    ).all()
    return [json.loads(body) for body in bodies]


def append_certificate(
    session: Session, fields: JsonObject, signer: Ed25519PrivateKey
) -> Certificate:
    """Append one certificate at the chain's head inside the caller's transaction."""
    return append_certificates(session, [fields], signer)[0]


def append_certificates(
    session: Session, many: list[JsonObject], signer: Ed25519PrivateKey
) -> list[Certificate]:
    """Append certificates in order at the chain's head, in one INSERT for all of them, and
    sign the new tree head with `signer` (the log's key, passed in by the caller).

    The chain's head and the tree's are read once per transaction, in one statement (under
    an advisory lock on PostgreSQL), and then carried in `session.info`, so a coalesced
    update appending many certificates neither re-reads them nor inserts one at a time.
    """
    head = session.info.get("audit_head")
    if head is None:
        head = _read_head(session)
    seq, prev, tree = head
    rows: list[dict[str, Any]] = []
    for fields in many:
        seq += 1
        created = utcnow()
        restricted = _nonempty(optional_object(fields.get(RESTRICTED)))
        doc = {k: v for k, v in fields.items() if k != RESTRICTED}
        doc = {**doc, "seq": seq, "prev_hash": prev, "created_at": created.isoformat()}
        body = canonical_json(doc)
        row = {k: doc[k] for k in INDEXED_FIELDS} | {
            "body": body,
            "restricted": canonical_json(restricted) if restricted else None,
            "created_at": created,
            "prev_hash": prev,
            "entry_hash": chain_hash(prev, body),
        }
        rows.append(row)
        prev = row["entry_hash"]
    certs = [Certificate(**row) for row in rows]  # detached; their ids come with the INSERT
    if certs:  # the tree and a signed head, inserted with the certificates (Core)
        signed, tree_rows = transparency.append(session, certs, signer, tree)
        returned = insert_together(session.connection(), tree_rows, (_TABLE, rows), _RETURNED)
        ids = {row.seq: row.id for row in returned}  # matched by seq, in any order
        for cert in certs:
            cert.id = ids[cert.seq]
        tree = (seq, str(signed["root_hash"]))  # signed at the newest certificate's seq
    session.info["audit_head"] = (seq, prev, tree)
    return certs


# (seq, id) back, matched by seq: asking for the rows in parameter order would make SQLAlchemy
# send SQLite one INSERT per row
_TABLE = cast(Table, Certificate.__table__)
_RETURNED = (_TABLE.c.seq, _TABLE.c.id)


def _read_head(session: Session) -> tuple[int, str, tuple[int, str]]:
    """The chain's head (seq, entry hash) and the tree's newest signed head (size, root)."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        # Serialise appenders; the unique prev_hash would catch a race anyway. Its own
        # statement: a statement's snapshot is taken before it waits on the lock.
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7461686501)")
    row = conn.execute(_HEADS).one()
    chain = (row.seq, row.entry_hash) if row.seq is not None else (0, GENESIS)
    tree = (int(row.tree_size), str(row.root_hash)) if row.tree_size is not None else (0, "")
    return (*chain, tree)


def _top(column: Any, by: Any, name: str) -> Any:
    """`column` of the row with the largest `by`, as a scalar subquery named `name`."""
    return select(column).order_by(by.desc()).limit(1).scalar_subquery().label(name)


_CHAIN, _TREE = Certificate.__table__.c, TreeHead.__table__.c
_HEADS = select(  # one round trip for both heads (NULLs on an empty log)
    _top(_CHAIN.seq, _CHAIN.seq, "seq"),
    _top(_CHAIN.entry_hash, _CHAIN.seq, "entry_hash"),
    _top(_TREE.tree_size, _TREE.tree_size, "tree_size"),
    _top(_TREE.root_hash, _TREE.tree_size, "root_hash"),
)


@event.listens_for(Session, "after_transaction_end")
def _forget_head(session: Session, transaction: Any) -> None:
    """The cached head is only valid inside the transaction that read it."""
    if transaction.parent is None:
        session.info.pop("audit_head", None)


def certificate_document(cert: Certificate, disclose: bool = False) -> JsonObject:
    """What the API shows: the hashed body plus its id and hashes (`disclose`: with the
    restricted constants' values and salts, for auditors and admins)."""
    body = disclosed(json.loads(cert.body), cert.restricted if disclose else None)
    return {"id": cert.id, **body, "entry_hash": cert.entry_hash}


def verify_rows(rows: Iterator[Certificate]) -> JsonObject:
    """Recompute the chain; name the first certificate whose hash or fields do not hold."""
    prev, checked = GENESIS, 0
    for cert in rows:
        reason = _row_problem(cert, prev)
        if reason:
            return {
                "ok": False,
                "checked": checked,
                "first_bad": {"id": cert.id, "seq": cert.seq, "reason": reason},
            }
        prev, checked = cert.entry_hash, checked + 1
    return {"ok": True, "checked": checked, "first_bad": None, "head": prev}


def _row_problem(cert: Certificate, prev: str) -> str | None:
    if cert.prev_hash != prev:
        return "prev_hash does not match the previous entry"
    if chain_hash(cert.prev_hash, cert.body) != cert.entry_hash:
        return "entry_hash does not match the body"
    try:
        doc = json.loads(cert.body)
    except ValueError:
        return "body is not JSON"
    if doc.get("prev_hash") != cert.prev_hash:
        return "body prev_hash differs from the column"
    for name in INDEXED_FIELDS:
        if doc.get(name) != getattr(cert, name):
            return f"column {name} differs from the hashed body"
    return None


def verify_chain(session: Session) -> JsonObject:
    rows = session.scalars(
        select(Certificate).order_by(Certificate.seq).execution_options(yield_per=500)
    )
    return verify_rows(iter(rows))


def export_lines(session: Session) -> Iterator[str]:
    """JSONL, one certificate a line, verifiable by scripts/verify_audit.py."""
    rows = session.scalars(
        select(Certificate).order_by(Certificate.seq).execution_options(yield_per=500)
    )
    for cert in rows:
        yield (
            json.dumps(
                {
                    "seq": cert.seq,
                    "prev_hash": cert.prev_hash,
                    "entry_hash": cert.entry_hash,
                    "body": cert.body,
                    # auditors only: the values behind the body's restricted commitments
                    **({"restricted": json.loads(cert.restricted)} if cert.restricted else {}),
                }
            )
            + "\n"
        )
