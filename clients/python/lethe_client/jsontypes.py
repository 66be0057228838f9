"""The type of a JSON document: what a certificate body, a view or a metrics record is. For
the type checker its values are pydantic's recursive `JsonValue` (str, int, float, bool, None,
lists and objects of them), so a tensor, a datetime or a row cannot slip into one unnoticed.
At run time a pydantic field of this type takes the dict as it is (it was read from a JSON
column or built by checked code; re-validating every nested value would cost a walk of big
metrics on every read) and its OpenAPI schema is a plain object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import JsonValue, WithJsonSchema

if TYPE_CHECKING:
    JsonObject = dict[str, JsonValue]
else:
    JsonObject = Annotated[
        dict[str, Any], WithJsonSchema({"type": "object", "description": "a JSON object"})
    ]

# A read-only view of one: what a function or a value type takes (covariant, so a
# dict[str, float] of metrics is one too).
JsonMap = Mapping[str, JsonValue]

__all__ = [
    "JsonMap",
    "JsonObject",
    "JsonValue",
    "as_number",
    "as_object",
    "json_object",
    "optional_object",
]


def as_object(value: JsonValue) -> JsonObject:
    """`value` as a JSON object (a TypeError if the document holds something else there)."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def as_number(value: JsonValue) -> float:
    """`value` as a number (a TypeError if the document holds something else there)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def optional_object(value: JsonValue) -> JsonObject | None:
    """`value` as a JSON object, or None where the document has null."""
    return None if value is None else as_object(value)


def json_object(values: JsonMap) -> JsonObject:
    """A JSON object holding `values` (a dict of floats, say) where a document needs one."""
    return dict(values)
