"""Chunked sealing of a blob: AES-256-GCM per chunk under the blob's data key.

A sealed blob is a 16-byte header, then chunks: nonce (12) ‖ ciphertext ‖ tag (16). Every chunk
but the last holds exactly `chunk_size` plaintext bytes, so plaintext offset o lies in chunk
o // chunk_size at a known sealed offset: a range of a blob is read and opened without the
rest. Each chunk's associated data binds the blob's key, the header, the chunk's index and
whether it is the last one, so chunks cannot be moved, swapped between blobs, dropped from
the end or the stream cut short without the open failing (the STREAM construction of Hoang,
Reyhanitabar, Rogaway and Vizár, "Online Authenticated-Encryption and its Nonce-Reuse
Misuse-Resistance", CRYPTO 2015, with random nonces under a key used for one blob only)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.core.storage.crypto import NONCE_BYTES, SealError, blob_aad

MAGIC = b"LTHB"
FORMAT = 2  # 1 was a whole blob sealed at once, kept in the `blobs` row
HEADER = struct.Struct("<4sBI7x")  # magic, format, plaintext bytes per chunk
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
DEFAULT_CHUNK = 1 << 20


@dataclass(frozen=True)
class Layout:
    """Where a blob's plaintext lies in its sealed bytes."""

    size: int  # plaintext bytes
    chunk_size: int

    @property
    def chunks(self) -> int:
        return max(1, -(-self.size // self.chunk_size))

    @property
    def sealed_size(self) -> int:
        return HEADER.size + self.chunks * OVERHEAD + self.size

    def offset(self, index: int) -> int:
        """The sealed offset of chunk `index`."""
        return HEADER.size + index * (self.chunk_size + OVERHEAD)

    def plain_length(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)


def _aad(key: str, header: bytes, index: int, final: bool) -> bytes:
    return blob_aad(key).encode() + b"\0" + header + struct.pack("<QB", index, final)


def seal_stream(
    data_key: bytes, key: str, pieces: Iterable[bytes | memoryview], chunk_size: int = DEFAULT_CHUNK
) -> Iterator[bytes]:
    """Sealed bytes of the concatenated `pieces`, one chunk at a time: at most two chunks of
    plaintext are held (the one being filled and the one waiting to learn if it is the last)."""
    header = HEADER.pack(MAGIC, FORMAT, chunk_size)
    aead = AESGCM(data_key)
    yield header
    index = 0
    pending: bytes | memoryview | None = None  # a full chunk, sealed once we know whether
    fill = bytearray()  # another follows; `fill` collects a chunk that spans pieces
    for piece in pieces:
        view = memoryview(piece).cast("B")
        at = 0
        while at < len(view):
            if not fill and len(view) - at >= chunk_size:  # a whole chunk in place: no copy
                full: bytes | memoryview = view[at : at + chunk_size]
                at += chunk_size
            else:
                take = min(chunk_size - len(fill), len(view) - at)
                fill += view[at : at + take]
                at += take
                if len(fill) < chunk_size:
                    continue
                full, fill = bytes(fill), bytearray()
            if pending is not None:
                yield _seal_chunk(aead, key, header, index, False, pending)
                index += 1
            pending = full
    if pending is not None and fill:
        yield _seal_chunk(aead, key, header, index, False, pending)
        index += 1
        pending = None
    last = pending if pending is not None else bytes(fill)
    yield _seal_chunk(aead, key, header, index, True, last)


def _seal_chunk(
    aead: AESGCM, key: str, header: bytes, index: int, final: bool, plain: bytes | memoryview
) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + aead.encrypt(nonce, plain, _aad(key, header, index, final))


def parse_header(header: bytes, key: str) -> int:
    """The chunk size a sealed blob's header declares."""
    if len(header) != HEADER.size:
        raise SealError(f"blob {key!r}: the sealed header is cut short")
    magic, fmt, chunk_size = HEADER.unpack(header)
    if magic != MAGIC or fmt != FORMAT or chunk_size <= 0:
        raise SealError(f"blob {key!r}: not a sealed blob of format {FORMAT}")
    return int(chunk_size)


def sealed_chunks(
    key: str, layout: Layout, first: int, last: int, sealed: Iterable[bytes]
) -> Iterator[tuple[int, bytes | bytearray]]:
    """(index, sealed bytes) of chunks `first` … `last` from the blob's sealed bytes starting
    at chunk `first`, in pieces of any size (a piece that is exactly one chunk is passed on
    without a copy). Bytes that end before chunk `last` are a blob cut short: SealError."""
    index = first
    buf = bytearray()
    need = OVERHEAD + layout.plain_length(index)
    for piece in sealed:
        if not buf and len(piece) == need:  # the reader cut its pieces at chunk boundaries
            yield index, piece
            index += 1
        else:
            buf += piece
            while index <= last and len(buf) >= need:
                yield index, buf[:need]
                del buf[:need]
                index += 1
                if index <= last:
                    need = OVERHEAD + layout.plain_length(index)
        if index > last:
            return
        need = OVERHEAD + layout.plain_length(index)
    if index <= last:
        raise SealError(f"blob {key!r}: chunk {index} is cut short or missing")


def open_chunks(
    data_key: bytes,
    key: str,
    header: bytes,
    layout: Layout,
    first: int,
    last: int,
    sealed: Iterable[bytes],
) -> Iterator[bytes]:
    """Plaintext chunks `first` … `last`. A tampered, misplaced or missing chunk raises
    SealError: never a shorter or different answer."""
    aead = AESGCM(data_key)
    for index, chunk in sealed_chunks(key, layout, first, last, sealed):
        aad = _aad(key, header, index, index == layout.chunks - 1)
        view = memoryview(chunk)
        try:
            yield aead.decrypt(view[:NONCE_BYTES], view[NONCE_BYTES:], aad)
        except InvalidTag as exc:
            raise _tampered(key, index) from exc
        finally:
            view.release()


def open_into(
    data_key: bytes,
    key: str,
    header: bytes,
    layout: Layout,
    sealed: Iterable[bytes],
    out: memoryview,
) -> None:
    """Open a whole blob straight into `out` (its size): each chunk is decrypted in place."""
    aead = AESGCM(data_key)
    for index, chunk in sealed_chunks(key, layout, 0, layout.chunks - 1, sealed):
        at, n = index * layout.chunk_size, layout.plain_length(index)
        aad = _aad(key, header, index, index == layout.chunks - 1)
        view = memoryview(chunk)
        try:
            aead.decrypt_into(view[:NONCE_BYTES], view[NONCE_BYTES:], aad, out[at : at + n])
        except InvalidTag as exc:
            raise _tampered(key, index) from exc
        finally:
            view.release()


def _tampered(key: str, index: int) -> SealError:
    return SealError(f"blob {key!r}: chunk {index} does not open (tampered or moved)")
