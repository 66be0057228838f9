"""The public log as C2SP tlog-tiles, checkpoints and tlog-proof files.

The public log is its own tree (`public_nodes`), grown with the certificates' tree in the same
transaction: its entry i is SHA-256 of certificate i + 1's body (32 bytes), so tiles, entries
and checkpoints can be public while a certificate's content (its counts, its n-dependent
constants) stays with its requester and the auditors. The hashes of tile (L, N) are the
stored nodes at tree level 8·L, indices N·256 … N·256 + W − 1; entry bundles are the entries,
each prefixed by its length as a big-endian uint16. A checkpoint is the signed note of the
public tree's size and root under the log's origin (app/core/ledger/notes.py); a `.tlog-proof`
carries the certificate body in its `extra` line, which the verifier hashes to the entry."""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import Certificate, PublicNode, TreeHead
from app.core.ledger import merkle, notes
from app.core.ledger.notes import Checkpoint, NoteError, Verifier
from app.core.ledger.transparency import StoredNodes, public_entry

HEIGHT = 8
WIDTH = 1 << HEIGHT
PROOF_HEADER = "c2sp.org/tlog-proof@v1"

_INDEX = re.compile(r"^(?:x\d{3}/)*\d{3}$")
MAX_INDEX_TEXT = 33  # an index below 2^64: 7 groups of 3 digits, 6 of them "x…/"


@dataclass(frozen=True)
class TilePath:
    """A tile request: level (None for an entry bundle), index, and width if partial."""

    level: int | None
    index: int
    width: int | None


def encode_index(index: int) -> str:
    """N as zero-padded 3-digit path elements, all but the last prefixed with `x`."""
    digits = str(index)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i : i + 3] for i in range(0, len(digits), 3)]
    return "/".join([*(f"x{g}" for g in groups[:-1]), groups[-1]])


def tile_path(level: int | None, index: int, width: int | None = None) -> str:
    head = "entries" if level is None else str(level)
    tail = f".p/{width}" if width is not None else ""
    return f"tile/{head}/{encode_index(index)}{tail}"


def parse_tile_path(path: str) -> TilePath:
    """`<L>/<N>[.p/<W>]` or `entries/<N>[.p/<W>]` (what follows `tile/`); ValueError else."""
    head, _, rest = path.partition("/")
    width = None
    if ".p/" in rest:
        rest, _, w = rest.partition(".p/")
        if not (len(w) <= 3 and w.isascii() and w.isdigit()) or str(int(w)) != w:
            raise ValueError("a partial tile's width is 1 to 255, no leading zeros")
        if not 1 <= int(w) < WIDTH:
            raise ValueError("a partial tile's width is 1 to 255, no leading zeros")
        width = int(w)
    if not _INDEX.match(rest) or len(rest) > MAX_INDEX_TEXT:
        raise ValueError("a tile index is at most 7 3-digit groups, all but the last prefixed by x")
    index = int(rest.replace("x", "").replace("/", ""))
    if encode_index(index) != rest:
        raise ValueError("a tile index has no extra leading groups")
    if head == "entries":
        return TilePath(None, index, width)
    if not (len(head) <= 2 and head.isascii() and head.isdigit()) or str(int(head)) != head:
        raise ValueError("a tile level is 0 to 63, no leading zeros")
    if int(head) > 63:
        raise ValueError("a tile level is 0 to 63, no leading zeros")
    return TilePath(int(head), index, width)


def tile_width(size: int, level: int, index: int) -> int:
    """How many hashes tile (level, index) holds in a tree of `size` leaves (0: none yet)."""
    complete = size >> (HEIGHT * level)
    return max(0, min(WIDTH, complete - index * WIDTH))


def hash_tile(session: Session, level: int, index: int, width: int) -> bytes:
    """The concatenated hashes of a tile: complete subtrees at tree level 8·level."""
    first = index * WIDTH
    rows = session.execute(
        select(PublicNode.idx, PublicNode.hash)
        .where(
            PublicNode.level == HEIGHT * level,
            PublicNode.idx >= first,
            PublicNode.idx < first + width,
        )
        .order_by(PublicNode.idx)
    ).all()
    if [r.idx for r in rows] != list(range(first, first + width)):
        raise LookupError(f"tile {level}/{index} is missing nodes")
    return b"".join(bytes.fromhex(r.hash) for r in rows)


def entry_bundle(session: Session, index: int, width: int) -> bytes:
    """The entries of leaves index·256 … index·256 + width − 1, uint16-length-prefixed."""
    first = index * WIDTH + 1  # certificate seq = leaf index + 1
    bodies = session.scalars(
        select(Certificate.body)
        .where(Certificate.seq >= first, Certificate.seq < first + width)
        .order_by(Certificate.seq)
    ).all()
    if len(bodies) != width:
        raise LookupError(f"entry bundle {index} is missing entries")
    out = bytearray()
    for body in bodies:
        raw = public_entry(body)
        out += struct.pack(">H", len(raw)) + raw
    return bytes(out)


def split_bundle(bundle: bytes) -> list[bytes]:
    entries, at = [], 0
    while at < len(bundle):
        if at + 2 > len(bundle):
            raise ValueError("an entry bundle ends inside a length")
        (n,) = struct.unpack_from(">H", bundle, at)
        entries.append(bundle[at + 2 : at + 2 + n])
        at += 2 + n
        if at > len(bundle):
            raise ValueError("an entry bundle ends inside an entry")
    return entries


# ---- checkpoints ----------------------------------------------------------------------------


def public_checkpoint(session: Session, origin: str) -> Checkpoint | None:
    """The public tree's checkpoint at the newest head's size (None when nothing is logged)."""
    size = session.scalar(select(TreeHead.tree_size).order_by(TreeHead.tree_size.desc()))
    if not size:
        return None
    return Checkpoint(origin, size, StoredNodes(session, PublicNode).subtree(0, size))


def signed_checkpoint(checkpoint: Checkpoint, key: Ed25519PrivateKey) -> str:
    """The checkpoint as a note signed by the log (its origin is the key's name)."""
    return checkpoint.text + "\n" + notes.sign(checkpoint.text, checkpoint.origin, key)


# ---- tlog-proof -----------------------------------------------------------------------------


def tlog_proof(session: Session, certificate: Certificate, note: str) -> str:
    """A `.tlog-proof` for a certificate under a signed checkpoint (which must include it):
    the certificate's body rides in the `extra` line (its SHA-256 is the public entry), so the
    file alone is enough offline."""
    checkpoint = Checkpoint.parse(notes.split(note)[0])
    index = certificate.seq - 1
    if index >= checkpoint.size:
        raise LookupError(f"leaf {index} is not under the checkpoint of size {checkpoint.size}")
    nodes = StoredNodes(session, PublicNode)
    path = merkle.inclusion_path(index, checkpoint.size, nodes.subtree)
    lines = [
        PROOF_HEADER,
        f"extra {base64.b64encode(certificate.body.encode()).decode()}",
        f"index {index}",
        *(base64.b64encode(h).decode() for h in path),
        "",
    ]
    return "\n".join(lines) + "\n" + note


@dataclass(frozen=True)
class ProofPolicy:
    """Whom a verifier trusts: the log's key (its name is the origin), witnesses, a quorum."""

    log: Verifier
    witnesses: tuple[Verifier, ...] = ()
    quorum: int = 0

    @classmethod
    def parse(cls, text: str) -> ProofPolicy:
        """Lines `log <vkey>`, `witness <vkey>` (any number), `quorum <n>`; `#` comments."""
        log: Verifier | None = None
        witnesses: list[Verifier] = []
        quorum = 0
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            word, _, value = line.partition(" ")
            if word == "log":
                log = Verifier.parse(value)
            elif word == "witness":
                witnesses.append(Verifier.parse(value))
            elif word == "quorum" and value.strip().isdigit():
                quorum = int(value)
            else:
                raise NoteError(f"policy: cannot read {line!r}")
        if log is None:
            raise NoteError("policy: no `log <vkey>` line")
        if quorum > len(witnesses):
            raise NoteError("policy: the quorum is larger than the witnesses named")
        return cls(log, tuple(witnesses), quorum)


@dataclass(frozen=True)
class ProvenEntry:
    index: int
    entry: bytes
    checkpoint: Checkpoint
    cosigned_by: tuple[str, ...]


def verify_tlog_proof(text: str, policy: ProofPolicy) -> ProvenEntry:
    """Check a `.tlog-proof` offline: the checkpoint's log signature, a quorum of witness
    cosignatures, and that the certificate body (the `extra` line) hashes to the entry at
    `index` in its tree. Returns the body as `entry`."""
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or lines[0] != PROOF_HEADER:
        raise NoteError(f"not a {PROOF_HEADER} file")
    at = 1
    entry = b""
    if lines[at].startswith("extra "):
        entry = base64.b64decode(lines[at][6:], validate=True)
        at += 1
    if not lines[at].startswith("index ") or not lines[at][6:].isdigit():
        raise NoteError("a tlog-proof names its index on the line after the header")
    index = int(lines[at][6:])
    path = [base64.b64decode(h, validate=True) for h in lines[at + 1 :]]
    opened = notes.open_note(note, [policy.log, *policy.witnesses])
    if policy.log.name not in opened.signed_by:
        raise NoteError("the checkpoint is not signed by the log's key")
    checkpoint = Checkpoint.parse(opened.text)
    if checkpoint.origin != policy.log.name:
        raise NoteError(f"the checkpoint is for {checkpoint.origin!r}, not {policy.log.name!r}")
    cosigners = tuple(n for n in opened.signed_by if n in {w.name for w in policy.witnesses})
    if len(cosigners) < policy.quorum:
        raise NoteError(
            f"{len(cosigners)} of the {policy.quorum} witness cosignatures the policy needs"
        )
    leaf = merkle.leaf_hash(hashlib.sha256(entry).digest())  # the body's public entry
    if not merkle.verify_inclusion(leaf, index, checkpoint.size, path, checkpoint.root):
        raise NoteError("the inclusion proof does not lead to the checkpoint's root")
    return ProvenEntry(index, entry, checkpoint, cosigners)


class TileHashes:
    """Any subtree hash of a tree of `size` leaves, computed from its tiles as fetched by
    `fetch(path)` (a third party's view: what a monitor or a client without an API key has)."""

    def __init__(self, fetch: Callable[[str], bytes], size: int) -> None:
        self.fetch, self.size = fetch, size
        self._tiles: dict[tuple[int, int], bytes] = {}

    def _tile(self, level: int, index: int) -> bytes:
        if (level, index) not in self._tiles:
            width = tile_width(self.size, level, index)
            data = self.fetch(tile_path(level, index, None if width == WIDTH else width))
            if len(data) != 32 * width:
                raise ValueError(f"tile {level}/{index} has {len(data)} bytes, not {32 * width}")
            self._tiles[(level, index)] = data
        return self._tiles[(level, index)]

    def node(self, height: int, index: int) -> bytes:
        """The complete subtree of 2^height leaves number `index`."""
        level, within = divmod(height, HEIGHT)
        first = index << within
        data = self._tile(level, first // WIDTH)
        at = first % WIDTH
        row = [data[32 * i : 32 * (i + 1)] for i in range(at, at + (1 << within))]
        while len(row) > 1:
            row = [merkle.node_hash(row[i], row[i + 1]) for i in range(0, len(row), 2)]
        return row[0]

    def subtree(self, start: int, end: int) -> bytes:
        n = end - start
        if n & (n - 1) == 0 and start % n == 0:
            return self.node(n.bit_length() - 1, start // n)
        k = merkle.split(n)
        return merkle.node_hash(self.subtree(start, start + k), self.subtree(start + k, end))


def check_extension(old: Checkpoint, new: Checkpoint, fetch: Callable[[str], bytes]) -> None:
    """That `new` extends `old`, from the tiles alone: the tiles reproduce `new`'s root and a
    consistency proof computed from them leads from `old`'s root to it. NoteError if not."""
    if new.origin != old.origin:
        raise NoteError("the checkpoints are of two logs")
    if new.size < old.size:
        raise NoteError(f"the log shrank from {old.size} to {new.size} leaves")
    if new.size == old.size:
        if new.root != old.root:
            raise NoteError(f"two roots for size {new.size}: the log forked")
        return
    hashes = TileHashes(fetch, new.size)
    if hashes.subtree(0, new.size) != new.root:
        raise NoteError("the tiles do not reproduce the checkpoint's root")
    if old.size == 0:
        return
    path = merkle.consistency_path(old.size, new.size, hashes.subtree)
    if not merkle.verify_consistency(old.size, new.size, path, old.root, new.root):
        raise NoteError(
            f"the log of size {new.size} does not extend the one of size {old.size} "
            "that was checked before: it was rewritten"
        )
