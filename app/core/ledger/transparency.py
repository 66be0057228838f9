"""The certificates' Merkle tree and its signed heads: kept beside the hash chain,
grown in the same transaction as the certificates, so a third party can check inclusion and
append-only growth without trusting the database (RFC 6962 / 9162; ledger/merkle.py does the
hashing).

Storage: `merkle_nodes` holds every complete subtree (level 0: one leaf per certificate, leaf
index = seq − 1, entry = the certificate's canonical body); `tree_heads` one Ed25519-signed
head per append (tree size, root, timestamp, key id). The signing key is 32 bytes from
LETHE_AUDIT_SIGNING_KEY (base64) or a file (default `<data_dir>/audit-signing.key`, created on
first use, mode 0600); `lethe audit rotate-key` retires it (its public key stays listed) and
the next start creates a new one.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from sqlalchemy import Table, and_, delete, func, insert, or_, select
from sqlalchemy.orm import Session

from app.core.db.session import Database
from app.core.db.tables import Certificate, MerkleNode, PublicNode, TreeHead
from app.core.errors import APIError, not_found
from app.core.jsontypes import JsonObject
from app.core.ledger import merkle
from app.core.ledger.notes import raw_public
from app.core.settings import Settings
from app.core.storage.crypto import forget_key_files, secret_at, secret_from_text

HEAD_FORMAT = "lethe-tree-head/v1"


# ---- keys -----------------------------------------------------------------------------------


def signing_key(settings: Settings) -> Ed25519PrivateKey:
    """The log's signing key, from the settings (the process's worker or API passes its own
    settings in: nothing here reads a global)."""
    if settings.audit_signing_key is not None:
        seed = secret_from_text(settings.audit_signing_key.get_secret_value(), "audit key")
    else:
        seed = secret_at(signing_key_file(settings))
    return Ed25519PrivateKey.from_private_bytes(seed)


def signing_key_file(settings: Settings) -> Path:
    return settings.audit_signing_key_file or settings.data_dir / "audit-signing.key"


def retired_dir(settings: Settings) -> Path:
    return settings.data_dir / "audit-retired-keys"


def key_id(key: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public(key)).hexdigest()[:32]


def public_keys(settings: Settings) -> list[JsonObject]:
    """The current public key and every retired one: heads name the key that signed them."""
    current = signing_key(settings).public_key()
    keys: list[JsonObject] = [
        {"key_id": key_id(current), "public_key": _b64(raw_public(current)), "current": True}
    ]
    folder = retired_dir(settings)
    for path in sorted(folder.glob("*.pub")) if folder.exists() else []:
        raw = base64.b64decode(path.read_text().strip())
        retired = Ed25519PublicKey.from_public_bytes(raw)
        if key_id(retired) != keys[0]["key_id"]:
            keys.append({"key_id": key_id(retired), "public_key": _b64(raw), "current": False})
    return keys


def rotate(settings: Settings) -> tuple[str, str]:
    """Retire the current key (its public half stays listed); the next use creates a new one.
    Returns (retired key id, new key id). Restart the API and workers afterwards."""
    if settings.audit_signing_key is not None:
        raise ValueError("the signing key comes from LETHE_AUDIT_SIGNING_KEY: change it there")
    old = signing_key(settings).public_key()
    folder = retired_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key_id(old)}.pub").write_text(_b64(raw_public(old)))
    signing_key_file(settings).unlink()
    forget_key_files()
    return key_id(old), key_id(signing_key(settings).public_key())


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def head_message(tree_size: int, root_hash: str, timestamp: str) -> bytes:
    """What a head's signature covers."""
    return f"{HEAD_FORMAT}\n{tree_size}\n{root_hash}\n{timestamp}".encode()


# ---- growing the tree -----------------------------------------------------------------------


class StoredNodes:
    """Stored complete subtrees of one tree (the certificates' `merkle_nodes`, or the public
    log's `public_nodes`), read through a cache; `subtree` hashes any leaf range."""

    def __init__(
        self,
        session: Session,
        table: type[MerkleNode] | type[PublicNode] = MerkleNode,
        known: dict[tuple[int, int], bytes] | None = None,
    ) -> None:
        self.session, self.table = session, table
        self.cache: dict[tuple[int, int], bytes] = dict(known or {})
        self.added: list[dict[str, object]] = []  # rows `put` since the last `write`

    def get(self, level: int, idx: int) -> bytes:
        if (level, idx) not in self.cache:
            node = cast(MerkleNode | PublicNode | None, self.session.get(self.table, (level, idx)))
            if node is None:
                raise LookupError(f"{self.table.__tablename__} ({level}, {idx}) is missing")
            self.cache[(level, idx)] = bytes.fromhex(node.hash)
        return self.cache[(level, idx)]

    def preload(self, walk: Callable[[merkle.Subtree], object]) -> None:
        """Read in one query every stored node that `walk` (a proof computed through the
        `subtree` it is given) will ask for: a proof is O(log² n) nodes, and reading them one
        primary-key lookup at a time was most of a receipt's cost."""
        wanted: set[tuple[int, int]] = set()

        def record(start: int, end: int) -> bytes:
            wanted.update(_complete_parts(start, end))
            return bytes(32)

        walk(record)
        by_level: dict[int, list[int]] = {}
        for level, idx in sorted(k for k in wanted if not self._derived(*k)):
            by_level.setdefault(level, []).append(idx)
        if not by_level:
            return
        table = self.table
        # `level = ? AND idx IN (...)` per level: both databases search the primary key with
        # it, where SQLite scans the whole table for a row-value `(level, idx) IN (...)`
        rows = self.session.execute(
            select(table.level, table.idx, table.hash).where(
                or_(*(and_(table.level == lv, table.idx.in_(ix)) for lv, ix in by_level.items()))
            )
        )
        for level, idx, value in rows:
            self.cache[(level, idx)] = bytes.fromhex(value)

    def _derived(self, level: int, idx: int) -> bool:
        """Whether (level, idx) is cached or is now, hashed from its children (RFC 9162
        §2.1.1) down its right edge while each left child is cached: the subtrees a new leaf
        completes, at most `level` hashes, no read."""
        if (level, idx) in self.cache:
            return True
        left = (level - 1, 2 * idx)
        if level == 0 or left not in self.cache or not self._derived(level - 1, 2 * idx + 1):
            return False
        right = self.cache[(level - 1, 2 * idx + 1)]
        self.cache[(level, idx)] = merkle.node_hash(self.cache[left], right)
        return True

    def put(self, level: int, idx: int, value: bytes) -> None:
        self.cache[(level, idx)] = value
        self.added.append({"level": level, "idx": idx, "hash": value.hex()})

    def write(self) -> None:
        """Insert the nodes `put` since the last write: one Core statement (an append's few
        nodes cost a millisecond of ORM flush per deletion)."""
        if self.added:
            self.session.connection().execute(insert(self.table), self.added)
            self.added = []

    def subtree(self, start: int, end: int) -> bytes:
        n = end - start
        if n & (n - 1) == 0 and start % n == 0:
            return self.get(n.bit_length() - 1, start // n)
        k = merkle.split(n)
        return merkle.node_hash(self.subtree(start, start + k), self.subtree(start + k, end))

    def add_leaf(self, index: int, entry: bytes) -> None:
        """Leaf `index` and every subtree it completes."""
        value, level, idx = merkle.leaf_hash(entry), 0, index
        self.put(level, idx, value)
        while idx & 1:
            value = merkle.node_hash(self.get(level, idx - 1), value)
            level, idx = level + 1, idx >> 1
            self.put(level, idx, value)


def _complete_parts(start: int, end: int) -> list[tuple[int, int]]:
    """The stored complete subtrees, as (level, index), whose hashes make leaves [start, end)."""
    n = end - start
    if n & (n - 1) == 0 and start % n == 0:
        return [(n.bit_length() - 1, start // n)]
    k = merkle.split(n)
    return _complete_parts(start, start + k) + _complete_parts(start + k, end)


def leaf_count(session: Session) -> int:
    """The tree's size: every append signs a head at its new size, so it is the largest
    signed size (a primary-key lookup, not a count over the leaves)."""
    return int(session.scalar(select(func.max(TreeHead.tree_size))) or 0)


def append(
    session: Session,
    certificates: list[Certificate],
    signer: Ed25519PrivateKey,
    newest: tuple[int, str],
) -> tuple[JsonObject, list[tuple[Table, list[dict[str, Any]]]]]:
    """Add these certificates' leaves (after any the tree is missing, e.g. certificates
    written before the tree existed) and sign the new head: returns the head and the rows
    to insert, table by table (the new nodes of both trees and the head), which the caller
    inserts in its transaction with the certificates (`bulk.insert_together`). `newest`: the
    newest signed head's (size, root), as the caller read it in this transaction ((0, "")
    before the first)."""
    size, root = newest
    frontiers = Database.of(session).own(Frontiers)
    known, known_public = frontiers.at(size, root)
    nodes = StoredNodes(session, known=known)
    public = StoredNodes(session, PublicNode, known=known_public)
    last = max(c.seq for c in certificates)
    earlier: list[Certificate] = []
    if size < last - len(certificates):  # catch up on earlier certificates first
        earlier = list(
            session.scalars(
                select(Certificate)
                .where(Certificate.seq > size, Certificate.seq <= last - len(certificates))
                .order_by(Certificate.seq)
            )
        )
    for cert in [*earlier, *sorted(certificates, key=lambda c: c.seq)]:
        nodes.add_leaf(cert.seq - 1, cert.body.encode())
        public.add_leaf(cert.seq - 1, public_entry(cert.body))
    head = _signed_head(nodes, last, signer)  # reads the certificates' frontier
    for level, index in frontier(last):  # and the public tree's, once after a cold start
        public.get(level, index)
    frontiers.keep(last, str(head["root_hash"]), nodes.cache, public.cache)
    return head, [(_MERKLE, nodes.added), (_PUBLIC, public.added), (_HEADS, [head])]


_MERKLE, _PUBLIC, _HEADS = (cast(Table, t.__table__) for t in (MerkleNode, PublicNode, TreeHead))


def frontier(size: int) -> list[tuple[int, int]]:
    """The (level, index) of the complete subtrees a tree of `size` leaves splits into, left to
    right: all that appending the next leaf and hashing the new root read (RFC 9162 §2.1.1)."""
    out, start = [], 0
    for level in range(size.bit_length() - 1, -1, -1):
        if size & (1 << level):
            out.append((level, start >> level))
            start += 1 << level
    return out


class Frontiers:
    """The frontier nodes of both trees as this process last appended them, one per
    database (`Database.own`), so an append reads no node (O(log n) primary-key
    reads per update). Valid only while the newest signed head is the one they were kept at
    (same size and root: a rewritten or rolled-back tree has another), else forgotten; O(log
    n) nodes each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: tuple[int, str, Nodes, Nodes] | None = None

    def at(self, size: int, root: str) -> tuple[Nodes, Nodes]:
        with self._lock:
            held = self._held
            if held is None or held[:2] != (size, root):
                return {}, {}
            return dict(held[2]), dict(held[3])

    def keep(self, size: int, root: str, nodes: Nodes, public: Nodes) -> None:
        """Keep the frontier nodes of both trees at `size` leaves (the next append's frontier
        is this one's nodes and those it writes)."""
        wanted = frontier(size)
        with self._lock:
            self._held = (
                size,
                root,
                {k: nodes[k] for k in wanted if k in nodes},
                {k: public[k] for k in wanted if k in public},
            )


Nodes = dict[tuple[int, int], bytes]


class ProvenNodes:
    """Stored complete subtrees of the certificates' tree that this process has read for
    proofs, one per database (`Database.own`): a stored complete subtree never changes, and a
    receipt for the newest certificate needs the nodes the previous receipt read (instead of
    one query and its ORM rows per receipt in the API). A proof made from them is checked
    against its signed head's root, and they are dropped if it differs (a database restored
    under the process). At most LIMIT nodes."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Nodes = {}

    def known(self) -> Nodes:
        with self._lock:
            return dict(self._held)

    def keep(self, nodes: Nodes) -> None:
        with self._lock:
            if len(self._held) + len(nodes) > self.LIMIT:
                self._held.clear()
            self._held.update(nodes)

    def forget(self) -> None:
        with self._lock:
            self._held.clear()


def public_entry(body: str) -> bytes:
    """The public log's entry for a certificate: the SHA-256 of its body (32 bytes). Whoever
    holds the body (its requester, an auditor) checks it against the public log; nobody
    learns from the log what a certificate says."""
    return hashlib.sha256(body.encode()).digest()


def _sign_head(
    session: Session, nodes: StoredNodes, size: int, key: Ed25519PrivateKey
) -> JsonObject:
    view = _signed_head(nodes, size, key)
    session.connection().execute(insert(TreeHead), view)
    return view


def _signed_head(nodes: StoredNodes, size: int, key: Ed25519PrivateKey) -> JsonObject:
    """The tree head of `size` leaves, signed with `key`: not yet stored."""
    root = nodes.subtree(0, size).hex()
    timestamp = datetime.now(UTC).isoformat(timespec="microseconds")
    head = TreeHead(
        tree_size=size,
        root_hash=root,
        timestamp=timestamp,
        key_id=key_id(key.public_key()),
        signature=_b64(key.sign(head_message(size, root, timestamp))),
    )
    return head_view(head)


def rebuild(session: Session, signer: Ed25519PrivateKey) -> JsonObject:
    """Recompute the whole tree from the certificates as they are and sign a head (after a
    restore, or, as the tests do, to show that a rewritten log cannot pass for the old one).
    The log's tables are append-only: run it inside `app.core.db.append_only.lifted`."""
    session.execute(delete(MerkleNode))
    session.execute(delete(PublicNode))
    session.execute(delete(TreeHead))
    nodes, public = StoredNodes(session), StoredNodes(session, PublicNode)
    size = 0
    for cert in session.scalars(select(Certificate).order_by(Certificate.seq)):
        nodes.add_leaf(cert.seq - 1, cert.body.encode())
        public.add_leaf(cert.seq - 1, public_entry(cert.body))
        size = cert.seq
    nodes.write()
    public.write()
    return _sign_head(session, nodes, size, signer)


# ---- reading: heads, proofs, receipts -------------------------------------------------------


def head_view(head: TreeHead) -> JsonObject:
    return {
        "tree_size": head.tree_size,
        "root_hash": head.root_hash,
        "timestamp": head.timestamp,
        "key_id": head.key_id,
        "signature": head.signature,
    }


def latest_head(session: Session) -> JsonObject:
    head = session.scalar(select(TreeHead).order_by(TreeHead.tree_size.desc()).limit(1))
    if head is None:
        raise APIError(404, "empty_log", "no certificate has been logged yet")
    return head_view(head)


def head_at(session: Session, tree_size: int) -> JsonObject:
    head = session.get(TreeHead, tree_size)
    if head is None:
        raise not_found("tree head", tree_size)
    return head_view(head)


def latest_size(session: Session) -> int:
    """The size of the tree the latest signed head covers (404 before the first)."""
    size = session.scalar(select(TreeHead.tree_size).order_by(TreeHead.tree_size.desc()).limit(1))
    if size is None:
        raise APIError(404, "empty_log", "no certificate has been logged yet")
    return size


def inclusion(session: Session, certificate_id: int, tree_size: int | None) -> JsonObject:
    """The inclusion proof of a certificate in the tree of `tree_size` (default: the latest
    signed head), with that head when one was signed at that size."""
    cert = session.get(Certificate, certificate_id)
    if cert is None:
        raise not_found("certificate", certificate_id)
    size = tree_size or latest_size(session)
    if not cert.seq <= size <= leaf_count(session):
        raise APIError(
            422,
            "bad_tree_size",
            f"certificate {certificate_id} is leaf {cert.seq - 1}; tree_size must be in "
            f"[{cert.seq}, {leaf_count(session)}]",
        )
    return _inclusion_at(session, cert, size)


def _inclusion_at(session: Session, cert: Certificate, size: int) -> JsonObject:
    """The inclusion proof of `cert` at `size`, a size the tree has reached: from the nodes
    earlier proofs read (`ProvenNodes`) when it proves the leaf against the signed head's root at
    that size, else from the database alone."""
    head = session.get(TreeHead, size)
    proven = Database.of(session).own(ProvenNodes)
    leaf = merkle.leaf_hash(cert.body.encode())
    known = proven.known() if head is not None else {}
    nodes, path, root = _inclusion_path(session, cert, leaf, size, known)
    if head is not None:
        signed = bytes.fromhex(head.root_hash)
        proves = merkle.verify_inclusion(leaf, cert.seq - 1, size, path, signed)
        if known and not proves:
            proven.forget()
            nodes, path, root = _inclusion_path(session, cert, leaf, size, {})
            proves = merkle.verify_inclusion(leaf, cert.seq - 1, size, path, signed)
        if proves:
            proven.keep(nodes.cache)
    return {
        "certificate_id": cert.id,
        "leaf_index": cert.seq - 1,
        "tree_size": size,
        "entry": cert.body,
        "leaf_hash": leaf.hex(),
        "root_hash": root,
        "inclusion_path": [h.hex() for h in path],
        "tree_head": head_view(head) if head is not None else None,
    }


def _inclusion_path(
    session: Session, cert: Certificate, leaf: bytes, size: int, known: Nodes
) -> tuple[StoredNodes, list[bytes], str]:
    """The nodes read (and `cert`'s leaf hash, `leaf`), the inclusion path of `cert` at
    `size` and the root they give."""
    nodes = StoredNodes(session, known=known)
    nodes.cache[(0, cert.seq - 1)] = leaf
    nodes.preload(
        lambda subtree: (merkle.inclusion_path(cert.seq - 1, size, subtree), subtree(0, size))
    )
    path = merkle.inclusion_path(cert.seq - 1, size, nodes.subtree)
    return nodes, path, nodes.subtree(0, size).hex()


def consistency(session: Session, first: int, second: int) -> JsonObject:
    """The consistency proof from the tree of `first` leaves to the tree of `second`."""
    size = leaf_count(session)
    if not 0 < first <= second <= size:
        raise APIError(
            422, "bad_tree_size", f"need 0 < first ≤ second ≤ {size}, got {first}, {second}"
        )
    nodes = StoredNodes(session)
    nodes.preload(
        lambda subtree: (
            subtree(0, first),
            subtree(0, second),
            merkle.consistency_path(first, second, subtree),
        )
    )
    return {
        "first": first,
        "second": second,
        "first_root": nodes.subtree(0, first).hex(),
        "second_root": nodes.subtree(0, second).hex(),
        "consistency_path": [
            h.hex() for h in merkle.consistency_path(first, second, nodes.subtree)
        ],
    }


def receipt(session: Session, certificate_id: int) -> JsonObject:
    """What a requester keeps: the certificate, the first signed head that includes it, and the
    inclusion proof at that size."""
    found = session.execute(  # one read for both (it is on a certificate's path)
        select(Certificate, TreeHead)
        .join(TreeHead, TreeHead.tree_size >= Certificate.seq)
        .where(Certificate.id == certificate_id)
        .order_by(TreeHead.tree_size)
        .limit(1)
    ).first()
    if found is None:
        if session.get(Certificate, certificate_id) is None:
            raise not_found("certificate", certificate_id)
        raise LookupError(f"certificate {certificate_id} is in no signed head yet")
    cert, head = found
    return _inclusion_at(session, cert, head.tree_size)  # a signed size: no check to read
