"""One canonical text for a sample or subject id, the same wherever an id is read: a
registration, an append, a deletion's body, a lookup, a lift and the suppression list. A
keyed token is an HMAC of this text, so two spellings of one id give one token.

The form: bytes decoded as UTF-8; Unicode NFKC (the identifier normalisation of UAX #31: it
composes as NFC does and also folds compatibility forms, such as full-width digits, that NFC
keeps apart); format characters removed (zero-width spaces and joiners, the byte-order mark,
soft hyphens, bidirectional marks: Unicode category Cf); surrounding whitespace trimmed; a
number from a typed column written once (`7`, `7.0` → `7`). A dataset may say its ids are
numbers (text `007` → `7`) and that their case does not matter (case-folded). Design note:
docs/design/canonical-ids.md.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from app.core.errors import unprocessable

MAX_ID_CHARS = 200
Case = Literal["sensitive", "insensitive"]


class BadId(ValueError):
    """An id that has no canonical form: empty, too long, a control character, not a number
    where numbers were promised, or bytes that are not UTF-8."""


@dataclass(frozen=True)
class IdForm:
    """How one dataset reads its ids. `legacy`: a dataset registered before canonical ids,
    whose stored tokens are of its ids as they were written then (they stay so)."""

    case: Case = "sensitive"
    numeric: bool = False
    legacy: bool = False

    def text(self, value: object) -> str:
        """The canonical text of one id (`BadId` when it has none)."""
        if self.legacy:
            return written(value)
        return canonical(value, numeric=self.numeric, fold=self.case == "insensitive")

    def texts(self, values: Iterable[object], what: str) -> list[str]:
        """`text` of each value; 422 naming the first bad one's position, not its value (an id
        may name a person)."""
        out = []
        for row, value in enumerate(values):
            try:
                out.append(self.text(value))
            except BadId as exc:
                raise unprocessable(
                    "bad_ids", f"{what}, row {row}: {exc}", {"column": what, "row": row}
                ) from None
        return out


@dataclass(frozen=True)
class DatasetIds:
    """A dataset's rules for its ids: whether case matters, which ids are numbers
    (`sample`, `subject`), and whether it predates canonical ids (`legacy`)."""

    case: Case = "sensitive"
    numeric: frozenset[str] = frozenset()
    legacy: bool = False

    @classmethod
    def of(cls, row: Any) -> DatasetIds:
        """The rules a dataset row keeps (`id_case`, `numeric_ids`, `ids_canonical`)."""
        return cls(row.id_case, frozenset(row.numeric_ids or ()), not row.ids_canonical)

    def form(self, kind: str) -> IdForm:
        """The form of its `sample` or `subject` ids."""
        return IdForm(self.case, kind in self.numeric, self.legacy)

    def as_json(self) -> dict[str, Any]:
        return {
            "id_case": self.case,
            "numeric_ids": sorted(self.numeric),
            "canonical": not self.legacy,
        }


def written(value: object) -> str:
    """An id as Lethe wrote it before canonical ids (`str` of what the parser produced): the
    text the tokens of legacy datasets and suppressions were made of."""
    return value.decode() if isinstance(value, bytes) else str(value)


def canonical(value: object, numeric: bool = False, fold: bool = False) -> str:
    """The canonical text of an id (see the module's docstring)."""
    if isinstance(value, bool):
        raise BadId("an id cannot be true or false")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise BadId("an id must be UTF-8 text") from None
    if not isinstance(value, str):
        value = str(value)  # numpy scalars and the like: their text
    if value.isascii() and value.isprintable():  # most ids: NFKC leaves ASCII as it is
        text = value.strip()
    else:
        text = "".join(c for c in unicodedata.normalize("NFKC", value) if not _format(c)).strip()
        if any(unicodedata.category(c) == "Cc" for c in text):
            raise BadId("an id must not hold control characters")
    if numeric:
        text = _numeric_text(text)
    if fold:
        text = folded(text)
    if not text:
        raise BadId("an id must not be empty (after trimming spaces and invisible characters)")
    if len(text) > MAX_ID_CHARS:
        raise BadId(f"an id must be at most {MAX_ID_CHARS} characters")
    return text


def _format(c: str) -> bool:
    return unicodedata.category(c) == "Cf"


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise BadId("an id cannot be NaN or infinite")
    if value.is_integer():
        return str(int(value))
    return repr(value)


def _numeric_text(text: str) -> str:
    """A text the dataset says is a number, written once: `007`, `+7`, `7.0` → `7`."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise BadId("this dataset's ids are numbers; this one is not") from None
    if not number.is_finite():
        raise BadId("an id cannot be NaN or infinite")
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def folded(text: str) -> str:
    """A canonical text with its case folded: the suppression list's any-case token."""
    if text.isascii():
        return text.lower()  # ASCII's case folding, and NFKC leaves it as it is
    return unicodedata.normalize("NFKC", text.casefold())
