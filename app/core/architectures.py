"""Parameter names and shapes an architecture spec implies, without torch (each
architecture's `ArchitectureKind`, mirroring the module its net.py builds), and a
safetensors header reader (no pickle)."""

from __future__ import annotations

import json
import struct
from math import prod
from typing import Any

from app.core.errors import unprocessable
from app.core.jsontypes import JsonObject
from app.core.specs import ArchitectureSpec, architecture_of
from architectures import kind_of

DTYPE_BYTES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2}


def parameter_shapes(
    spec: ArchitectureSpec | JsonObject, n_features: int, n_classes: int
) -> dict[str, list[int]]:
    """Names and shapes of the parameters of `build_net(spec, n_features, n_classes)`."""
    arch = architecture_of(spec)
    return kind_of(arch).parameter_shapes(arch, n_features, n_classes)


def safetensors_header(data: bytes) -> dict[str, dict[str, Any]]:
    """The tensor table of a safetensors file, checked for consistency (no data decoded)."""
    if len(data) < 8:
        raise unprocessable("malformed_weights", "not a safetensors file (too short)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8 or size > 100_000_000:
        raise unprocessable("malformed_weights", "safetensors header length is invalid")
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise unprocessable("malformed_weights", "safetensors header is not JSON") from exc
    if not isinstance(header, dict):
        raise unprocessable("malformed_weights", "safetensors header is not a table")
    header.pop("__metadata__", None)
    body = len(data) - 8 - size
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise unprocessable("malformed_weights", f"tensor {name!r} is malformed") from exc
        if dtype not in DTYPE_BYTES:
            raise unprocessable(
                "malformed_weights",
                f"tensor {name!r} has dtype {dtype}; use one of {sorted(DTYPE_BYTES)}",
            )
        if not (0 <= start <= end <= body) or end - start != prod(shape) * DTYPE_BYTES[dtype]:
            raise unprocessable("malformed_weights", f"tensor {name!r} has bad data offsets")
    return header


def check_weights(data: bytes, spec: dict[str, Any], n_features: int, n_classes: int) -> None:
    """422 unless the file holds exactly the architecture's parameters with their shapes."""
    header = safetensors_header(data)
    expected = parameter_shapes(spec, n_features, n_classes)
    got = {k: list(v["shape"]) for k, v in header.items()}
    if got != expected:
        raise unprocessable(
            "weights_do_not_match_architecture",
            "the weights do not match the architecture for this dataset",
            {"expected": expected, "got": got},
        )
