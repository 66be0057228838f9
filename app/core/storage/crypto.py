"""Crypto-shredding: every sample, statistic and blob is sealed with its own data key.

A data key is 32 random bytes, stored only wrapped by the master key (AES-256-GCM, the key
encryption key, held outside the database). Erasing destroys the wrapped key; the ciphertext
that the database's dead tuples, WAL or backups still hold can then never be opened. Sample
and subject ids are stored as keyed tokens (HMAC-SHA256 under a key derived from the master
key), so lookups work without the raw identifier ever reaching the database.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.core.settings import Settings

NONCE_BYTES = 12
KEY_BYTES = 32
TOKEN_PREFIX = "t:"


class SealError(RuntimeError):
    """A ciphertext did not open: wrong master key, wrong data key or tampered bytes."""


def seal(key: bytes, plaintext: bytes, aad: str, nonce: bytes | None = None) -> bytes:
    """AES-256-GCM: nonce ‖ ciphertext ‖ tag, bound to `aad` (what the bytes belong to).
    `nonce`: fresh random bytes the caller drew in bulk (each key seals once), else drawn."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad.encode())


def open_sealed(key: bytes, sealed: bytes, aad: str) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad.encode())
    except InvalidTag as exc:
        raise SealError(f"cannot open sealed bytes for {aad!r}") from exc


class Keyring:
    """The master key's three uses: wrap data keys, unwrap them, and derive id tokens."""

    def __init__(self, master: bytes) -> None:
        if len(master) != KEY_BYTES:
            raise ValueError(f"the master key must be {KEY_BYTES} bytes, got {len(master)}")
        self._kek = AESGCM(master)
        self._pepper = hmac.new(master, b"lethe/identifiers/v1", hashlib.sha256).digest()
        # HMAC's two keyed hashes (RFC 2104; the 32-byte key padded to the block), keyed once:
        # each token copies them, about twice as fast as copying an `hmac` object (a million-row
        # registration makes two million;
        # tests/service/test_sample_tokens.py checks them against `hmac`)
        block = self._pepper.ljust(hashlib.sha256().block_size, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        self.kek_id = hashlib.sha256(b"lethe/kek-id\0" + master).hexdigest()[:16]

    def new_data_key(self) -> tuple[bytes, bytes]:
        """A fresh data key: (raw, wrapped). Only the wrapped form is ever stored."""
        raw = AESGCM.generate_key(bit_length=256)
        return raw, self.wrap(raw)

    def new_data_keys(self, count: int) -> list[tuple[bytes, bytes]]:
        """`count` fresh data keys as `new_data_key` makes them, their randomness drawn in two
        reads of the OS's generator (a registration makes a million)."""
        raws = os.urandom(KEY_BYTES * count)
        nonces = os.urandom(NONCE_BYTES * count)
        out = []
        for i in range(count):
            raw = raws[i * KEY_BYTES : (i + 1) * KEY_BYTES]
            nonce = nonces[i * NONCE_BYTES : (i + 1) * NONCE_BYTES]
            out.append((raw, nonce + self._kek.encrypt(nonce, raw, b"lethe/data-key")))
        return out

    def wrap(self, raw: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._kek.encrypt(nonce, raw, b"lethe/data-key")

    def unwrap(self, wrapped: bytes) -> bytes:
        try:
            return self._kek.decrypt(
                wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], b"lethe/data-key"
            )
        except InvalidTag as exc:
            raise SealError(
                "a data key does not unwrap: this process's master key is not the one that "
                "wrapped it (set the same LETHE_MASTER_KEY on the API and every worker)"
            ) from exc

    def token(self, kind: str, dataset_id: int, value: str) -> str:
        """A stable keyed token for an identifier: equal ids give equal tokens, nothing more."""
        return self.tokens(kind, dataset_id, [value])[0]

    def tokens(self, kind: str, dataset_id: int, values: Sequence[str]) -> list[str]:
        """`token` of each of `values`: HMAC-SHA256 of "kind\\0dataset\\0value" under the
        identifier key, its first 24 bytes in URL-safe base64. Many at once: 24 bytes are 32
        base64 characters with no padding, so the MACs are encoded in one call and cut."""
        inner = self._inner.copy()
        inner.update(f"{kind}\0{dataset_id}\0".encode())
        start, outer = inner.copy, self._outer.copy
        macs = []
        for value in values:
            mac = start()
            mac.update(value.encode())
            out = outer()
            out.update(mac.digest())
            macs.append(out.digest()[:24])
        encoded = binascii.b2a_base64(b"".join(macs), newline=False).translate(_URLSAFE)
        text = encoded.decode()
        return [TOKEN_PREFIX + text[at : at + 32] for at in range(0, len(text), 32)]


_URLSAFE = bytes.maketrans(b"+/", b"-_")
RECORD_HEADER = struct.Struct("<qHH")  # SampleRecord's: label, id length, subject length + 1


@dataclass(frozen=True)
class SampleRecord:
    """What a sample's sealed payload holds: the label, both identifiers and the features."""

    label: int
    external_id: str
    subject_id: str | None
    features: bytes  # float32, C order

    _HEADER = RECORD_HEADER

    def encode(self) -> bytes:
        return b"".join(record_parts(self.label, self.external_id, self.subject_id, self.features))

    @classmethod
    def decode(cls, data: bytes) -> SampleRecord:
        label, ext_len, subj_len = cls._HEADER.unpack_from(data)
        at = cls._HEADER.size
        ext = data[at : at + ext_len].decode()
        at += ext_len
        subject = None
        if subj_len:
            subject = data[at : at + subj_len - 1].decode()
            at += subj_len - 1
        return cls(label, ext, subject, data[at:])


def record_parts(
    label: int, external_id: str, subject_id: str | None, features: bytes | memoryview
) -> tuple[bytes, bytes, bytes, bytes | memoryview]:
    """A SampleRecord's encoding in its four parts (header, id, subject, features), for a
    caller that joins many at once (a block: app/core/storage/sample_blocks.py)."""
    ext = external_id.encode()
    subj = b"" if subject_id is None else subject_id.encode()
    subj_len = 0 if subject_id is None else len(subj) + 1
    return RECORD_HEADER.pack(label, len(ext), subj_len), ext, subj, features


def sample_aad(dataset_id: int, external_token: str) -> str:
    return f"sample/{dataset_id}/{external_token}"


def statistic_aad(model_id: int, sample_id: int, kind: str) -> str:
    return f"statistic/{model_id}/{sample_id}/{kind}"


def blob_aad(key: str) -> str:
    return f"blob/{key}"


def load_master_key(settings: Settings) -> bytes:
    """LETHE_MASTER_KEY (base64), else LETHE_MASTER_KEY_FILE, else `<data_dir>/master.key`,
    created on first use with mode 0600 (every process of a deployment must share it)."""
    if settings.master_key is not None:
        return _decode_key(settings.master_key.get_secret_value(), "LETHE_MASTER_KEY")
    return _key_at(settings.master_key_file or settings.data_dir / "master.key")


@lru_cache(maxsize=8)
def _key_at(path: Path) -> bytes:
    """As given: resolving the path on every call was a system call per request."""
    return _key_from_file(path.resolve())


@lru_cache(maxsize=8)
def _key_from_file(path: Path) -> bytes:
    """Read once per process: every sample load and deletion request needs the key."""
    if not path.exists():
        _create_key_file(path)
    return _decode_key(_read_key_file(path), str(path))


def secret_at(path: Path) -> bytes:
    """32 secret bytes kept in a file (base64), created 0600 on first use: the master key's
    mechanism, for any key a deployment's processes must share (the audit signing seed)."""
    return _key_at(path)


def secret_from_text(text: str, where: str) -> bytes:
    """32 secret bytes given as base64 (an environment setting)."""
    return _decode_key(text, where)


def forget_key_files() -> None:
    """Drop the per-process cache of key files (after one is replaced, e.g. a rotation)."""
    _key_at.cache_clear()
    _key_from_file.cache_clear()


def _read_key_file(path: Path) -> str:
    for _ in range(100):  # another process may be between creating and writing the file
        if text := path.read_text().strip():
            return text
        time.sleep(0.02)
    raise ValueError(f"{path}: the master key file is empty")


def _create_key_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: when API and workers start together, one writes and all read the same key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _decode_key(text: str, where: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ValueError(f"{where}: the key must be base64") from exc
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{where}: the key must be {KEY_BYTES} bytes (base64 of 32)")
    return raw


def keyring(settings: Settings) -> Keyring:
    """The keyring of `settings`' master key: a Runtime makes one and passes it on (cheap:
    an AES-GCM key and two hashes)."""
    return Keyring(load_master_key(settings))
