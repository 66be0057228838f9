"""Parameter names and shapes an architecture spec implies, without torch (they mirror
maths/nets.py's nn.Sequential layout), and a safetensors header reader (no pickle)."""

from __future__ import annotations

import json
import struct
from math import prod
from typing import Any

from app.errors import unprocessable

DTYPE_BYTES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2}


def parameter_shapes(spec: dict[str, Any], n_features: int, n_classes: int) -> dict[str, list[int]]:
    """Names and shapes of the parameters of `build_net(spec, n_features, n_classes)`."""
    if spec["type"] == "logreg":
        return {"1.weight": [n_classes, n_features], "1.bias": [n_classes]}
    if spec["type"] == "topic_head":
        return {"B": [n_features, n_classes], "bias": [n_classes]}
    if spec["type"] == "topic_model":
        topics = spec.get("topics", 20)
        return {"A": [n_features, topics], "R": [topics, topics]}
    if spec["type"] == "random_features":  # 1.*: the frozen first layer (buffers)
        width = spec.get("width", 2048)
        return {
            "1.weight": [width, n_features],
            "1.bias": [width],
            "2.weight": [n_classes, width],
            "2.bias": [n_classes],
        }
    shapes: dict[str, list[int]] = {}
    index, width = 1, n_features
    for hidden in spec.get("hidden", [64, 64]):
        shapes[f"{index}.weight"], shapes[f"{index}.bias"] = [hidden, width], [hidden]
        index += 2  # Linear, activation
        width = hidden
    shapes[f"{index}.weight"], shapes[f"{index}.bias"] = [n_classes, width], [n_classes]
    return shapes


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
