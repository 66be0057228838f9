"""Signed notes, checkpoints and cosignatures as C2SP specifies them.

- c2sp.org/signed-note: text ending in a newline, a blank line, then signature lines
  `— <key name> base64(key id (4 bytes, big-endian) ‖ signature)`; an Ed25519 key's id is
  SHA-256(name ‖ 0x0A ‖ 0x01 ‖ public key)[:4], and its verifier key string (vkey) is
  `<name>+<key id hex>+base64(0x01 ‖ public key)`.
- c2sp.org/tlog-checkpoint: the note text `<origin>\\n<size>\\n<base64 root>\\n`.
- c2sp.org/tlog-cosignature (v1, Ed25519): a witness signs `cosignature/v1\\ntime <t>\\n` ‖
  the checkpoint text; the signature is `timestamp (u64, big-endian) ‖ Ed25519 signature`
  under key id SHA-256(name ‖ 0x0A ‖ 0x04 ‖ public key)[:4].
Nothing here touches the database: the log, the witness and the offline verifier share it."""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

DASH = "\u2014"
ED25519 = 0x01
COSIGNATURE = 0x04
MAX_SIGNATURES = 64


class NoteError(ValueError):
    """A note, checkpoint, vkey or signature that does not parse or does not verify."""


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, kind: int, public: bytes) -> bytes:
    """The 4-byte key id of signed-note: SHA-256(name ‖ 0x0A ‖ type ‖ public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4]


@dataclass(frozen=True)
class Verifier:
    """A key a verifier trusts: its name, type (0x01 a log's Ed25519 key, 0x04 a witness's
    cosignature key) and raw public key."""

    name: str
    kind: int
    public: bytes

    @property
    def id(self) -> bytes:
        return key_id(self.name, self.kind, self.public)

    @property
    def vkey(self) -> str:
        blob = base64.b64encode(bytes([self.kind]) + self.public).decode()
        return f"{self.name}+{self.id.hex()}+{blob}"

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        """A verifier from its vkey string; the key id in it must match the key."""
        try:
            name, hex_id, blob = vkey.strip().split("+", 2)
            raw = base64.b64decode(blob, validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NoteError(f"not a verifier key: {vkey!r}") from exc
        if not name or any(c.isspace() for c in name) or len(raw) != 33:
            raise NoteError(f"not an Ed25519 verifier key: {vkey!r}")
        made = cls(name, raw[0], raw[1:])
        if made.kind not in (ED25519, COSIGNATURE) or made.id.hex() != hex_id.lower():
            raise NoteError(f"verifier key {name!r}: wrong type or key id")
        return made

    def _key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.public)


def log_verifier(name: str, key: Ed25519PublicKey) -> Verifier:
    return Verifier(name, ED25519, raw_public(key))


def witness_verifier(name: str, key: Ed25519PublicKey) -> Verifier:
    return Verifier(name, COSIGNATURE, raw_public(key))


# ---- checkpoints ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes

    @property
    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or not lines[0]:
            raise NoteError("a checkpoint is origin, size and root hash, each on a line")
        if not is_uint64(lines[1]):
            raise NoteError("a checkpoint's size is a decimal below 2^64, no leading zeros")
        try:
            root = base64.b64decode(lines[2], validate=True)
        except (ValueError, binascii.Error) as exc:
            raise NoteError("a checkpoint's root hash does not parse") from exc
        size = int(lines[1])
        if len(root) != 32:
            raise NoteError("a checkpoint's root hash is malformed")
        return cls(lines[0], size, root)


def is_uint64(text: str) -> bool:
    """Whether `text` is a decimal in [0, 2^64) in ASCII digits with no leading zeros (a tree
    size, c2sp.org/tlog-checkpoint); checked before `int`, whose error for a very long number
    names an interpreter setting."""
    if not (0 < len(text) <= 20 and text.isascii() and text.isdigit()):
        return False
    return (text == "0" or text[0] != "0") and int(text) < 2**64


# ---- signing and opening --------------------------------------------------------------------


def sign(text: str, name: str, key: Ed25519PrivateKey) -> str:
    """A log's signature line (type 0x01) over a note text."""
    ident = key_id(name, ED25519, raw_public(key.public_key()))
    signature = key.sign(text.encode())
    return f"{DASH} {name} {base64.b64encode(ident + signature).decode()}\n"


def cosign(text: str, name: str, key: Ed25519PrivateKey, timestamp: int) -> str:
    """A witness's cosignature line (tlog-cosignature v1, type 0x04) over a checkpoint text."""
    ident = key_id(name, COSIGNATURE, raw_public(key.public_key()))
    signature = key.sign(_cosigned(text, timestamp))
    body = ident + struct.pack(">Q", timestamp) + signature
    return f"{DASH} {name} {base64.b64encode(body).decode()}\n"


def _cosigned(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def split(note: str) -> tuple[str, list[tuple[str, bytes]]]:
    """(text, [(key name, signature bytes)]) of a signed note; nothing is verified."""
    if "\n\n" not in note or not note.endswith("\n"):
        raise NoteError("a signed note is text, a blank line and signature lines")
    at = note.rindex("\n\n")
    text, block = note[: at + 1], note[at + 2 :]
    signatures: list[tuple[str, bytes]] = []
    for line in block.split("\n")[:-1]:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != DASH or not parts[1]:
            raise NoteError(f"not a signature line: {line[:80]!r}")
        try:
            signatures.append((parts[1], base64.b64decode(parts[2], validate=True)))
        except binascii.Error as exc:
            raise NoteError("a signature is not base64") from exc
    if not signatures or len(signatures) > MAX_SIGNATURES:
        raise NoteError("a signed note needs between 1 and 64 signatures")
    if any(ord(c) < 0x20 and c != "\n" for c in note):
        raise NoteError("a signed note holds a control character")
    return text, signatures


@dataclass(frozen=True)
class Opened:
    """A note whose signatures by known keys all verified: who signed, and cosignature times."""

    text: str
    signed_by: tuple[str, ...]  # the names of the verifiers whose signatures verified
    times: dict[str, int]  # cosigner name -> its timestamp


def open_note(note: str, verifiers: list[Verifier]) -> Opened:
    """Verify a signed note: signatures from unknown keys are ignored, a known key's bad
    signature rejects the note, and at least one known signature must verify."""
    text, signatures = split(note)
    known = {(v.name, v.id): v for v in verifiers}
    signed: list[str] = []
    times: dict[str, int] = {}
    for name, raw in signatures:
        verifier = known.get((name, raw[:4]))
        if verifier is None:
            continue
        try:
            if verifier.kind == COSIGNATURE:
                if len(raw) != 4 + 8 + 64:
                    raise NoteError(f"cosignature by {name} has the wrong length")
                (timestamp,) = struct.unpack(">Q", raw[4:12])
                verifier._key().verify(raw[12:], _cosigned(text, timestamp))
                times[name] = timestamp
            else:
                verifier._key().verify(raw[4:], text.encode())
        except InvalidSignature as exc:
            raise NoteError(f"the signature by {name} does not verify") from exc
        signed.append(name)
    if not signed:
        raise NoteError("no signature by a known key")
    return Opened(text, tuple(signed), times)


def with_signatures(note: str, lines: list[str]) -> str:
    """A signed note with more signature lines (a witness's answer appended)."""
    return note + "".join(line if line.endswith("\n") else line + "\n" for line in lines)
