"""A JSON column read and written as a pydantic type: the row holds the type's JSON, the code
holds the typed value (validated once, when it is read), never an untyped dict."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, TypeAdapter
from sqlalchemy import JSON, Dialect, TypeDecorator

from app.core.jsontypes import JsonObject

T = TypeVar("T")


class PydanticJSON(TypeDecorator[T], Generic[T]):
    """`mapped_column(PydanticJSON(PrivacyPolicy))` (or a discriminated union such as
    `Architecture`): binds the value's JSON (a plain dict is validated first, so nothing
    unvalidated is written) and reads back the typed value."""

    impl = JSON
    cache_ok = True

    def __init__(self, kind: Any) -> None:
        super().__init__()
        self.kind = kind
        self._adapter: TypeAdapter[T] = TypeAdapter(kind)

    def process_bind_param(self, value: T | JsonObject | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        typed = value if isinstance(value, BaseModel) else self._adapter.validate_python(value)
        return self._adapter.dump_python(typed, mode="json")

    def process_result_value(self, value: Any, dialect: Dialect) -> T | None:
        return None if value is None else self._adapter.validate_python(value)
