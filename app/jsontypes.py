"""The type of a JSON document: what a certificate body, a view or a metrics record is. Values
are pydantic's recursive `JsonValue` (str, int, float, bool, None, lists and objects of them),
so a tensor, a datetime or a row cannot slip into one unnoticed."""

from __future__ import annotations

from pydantic import JsonValue

JsonObject = dict[str, JsonValue]

__all__ = ["JsonObject", "JsonValue"]
