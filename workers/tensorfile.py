"""Safetensors without whole copies: encode tensors as a stream of views of their
own memory, decode a buffer into tensors that share it.

The format is the safetensors specification (huggingface/safetensors, "Format"): an 8-byte
little-endian header length N, N bytes of JSON header (padded with spaces to a multiple of 8)
mapping each name to dtype, shape and [begin, end) offsets into the byte buffer that follows,
and `__metadata__` (strings only). The library's own `save` builds one bytes object of the
whole file and `load` copies every tensor out of one; a 1 GiB state would be held two or three
times. Tensors are laid out largest element size first, so every tensor starts aligned."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_NAMES = {name: dtype for dtype, name in _DTYPES.items()}


def encode(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> tuple[int, Iterator[memoryview]]:
    """(total bytes, the file as a stream of memoryviews): the header, then each tensor's
    own bytes (a CPU tensor that is already contiguous is not copied)."""
    ordered = sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0]))
    cpu = [(name, _host(t)) for name, t in ordered]
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    at = 0
    for name, t in cpu:
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} has no safetensors name")
        n = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, at + n],
        }
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text

    def stream() -> Iterator[memoryview]:
        small = bytearray(head)  # the header and small tensors go downstream as one piece
        for _, t in cpu:
            if not t.numel():
                continue
            data = _bytes_of(t)
            if len(data) < SMALL:
                small += data
                if len(small) < PIECE:
                    continue
                data = memoryview(small)  # a full shared piece: out, and a new one begun
            elif small:
                yield memoryview(small)
            small = bytearray()
            yield data
        if small:
            yield memoryview(small)

    return len(head) + at, stream()


# Tensors under this many bytes are copied into a shared piece: a sealed blob pays Python per
# piece (hashing, sealing, writing), and a sharded state is ~160 tensors of a few hundred
# bytes (16 shards × 4 checkpoints), on every sharded deletion's store.
SMALL = 64 * 1024
PIECE = 1024 * 1024  # the largest shared piece: a stream never holds much more than this


def _host(t: torch.Tensor) -> torch.Tensor:
    """`t` as a contiguous CPU tensor outside autograd: itself when it already is one (three
    dispatches fewer per tensor)."""
    if t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad:
        return t
    return t.detach().to("cpu").contiguous()


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bytes as uint8
        return t.reshape(-1).view(torch.uint8).numpy().data
    return t.numpy().data.cast("B")


def decode(buffer: bytearray) -> dict[str, torch.Tensor]:
    """Tensors viewing `buffer` (no copy; they keep it alive). Checks the offsets cover the
    buffer exactly, as the specification requires."""
    header, base = _header(buffer)
    out: dict[str, torch.Tensor] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _NAMES[info["dtype"]]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(v) for v in info["data_offsets"])
        count = 1
        for s in shape:
            count *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != count * itemsize or base + end > len(buffer):
            raise ValueError(f"{name}: its offsets do not match its shape")
        spans.append((begin, end))
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=base + begin)
            out[name] = flat.reshape(shape)
    at = 0
    for begin, end in sorted(spans):
        if begin != at:
            raise ValueError("the tensors' offsets leave a gap or overlap")
        at = end
    if base + at != len(buffer):
        raise ValueError("the buffer holds bytes after the last tensor")
    return out


def metadata(buffer: bytes | bytearray) -> dict[str, str]:
    """The file's `__metadata__` (empty when it has none)."""
    found = _header(buffer)[0].get("__metadata__", {})
    return {str(k): str(v) for k, v in found.items()}


def _header(buffer: bytes | bytearray) -> tuple[dict[str, Any], int]:
    """The file's JSON header and where its tensors' bytes begin."""
    if len(buffer) < 8:
        raise ValueError("not a safetensors file: shorter than its header length")
    (n,) = struct.unpack_from("<Q", buffer)
    if n > len(buffer) - 8:
        raise ValueError("not a safetensors file: the header runs past the end")
    return json.loads(bytes(buffer[8 : 8 + n])), 8 + n


def encode_bytes(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The whole file as bytes (tests and small blobs)."""
    _, stream = encode(tensors, metadata)
    return b"".join(bytes(v) for v in stream)
