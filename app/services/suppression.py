"""The suppression list: erased people and samples stay erased (issue 55, goal 4; GDPR
practice keeps such a list). A deletion request records the keyed tokens of the subject and
sample ids it matched; a registration screens its rows against the list and refuses them
(`on_erased: refuse`, the default) or leaves them out (`skip`); an admin lifts one with a
reason (re-consent), which the row keeps. Only tokens are stored: an HMAC under the master
key, in a namespace of its own and without the dataset, so the same person's rows are
recognised in any later dataset; never the ids, nor a plain hash of them."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, String, any_, bindparam, column, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from app.db.chunks import CHUNK, chunked
from app.db.tables import Suppression, utcnow
from app.errors import APIError
from app.services.dataset_files import texts_at
from app.storage.crypto import Keyring

log = logging.getLogger("lethe.suppression")

KINDS = ("subject", "sample")
REPORT_IDS = 100  # ids named in a refusal (the client sent them; it knows them)


def suppression_token(ring: Keyring, kind: str, raw_id: str) -> str:
    """The keyed token of a subject or sample id on the list: dataset-independent."""
    return ring.token(f"suppressed-{kind}", 0, raw_id)


def suppression_tokens(ring: Keyring, kind: str, raw_ids: Sequence[str]) -> list[str]:
    """`suppression_token` of each of `raw_ids`, made together (`Keyring.tokens`)."""
    return ring.tokens(f"suppressed-{kind}", 0, raw_ids)


def suppress(
    session: Session, ring: Keyring, kind: str, raw_ids: Iterable[str], request_id: int
) -> list[dict[str, str]]:
    """Put these ids on the list (again, where a suppression was lifted), in the caller's
    transaction; the tokens, for the restore journal."""
    tokens = suppression_tokens(ring, kind, list(dict.fromkeys(raw_ids)))
    put_tokens(session, kind, tokens, request_id)
    return [{"kind": kind, "token": t} for t in tokens]


def put_tokens(session: Session, kind: str, tokens: list[str], request_id: int | None) -> None:
    """`suppress` with the tokens made (a restore puts the journal's back). A lifted token put
    back is on the list from now (`created_at`): an upload's late check (`Screener.late`)
    finds the entries made since it screened, a person erased again among them."""
    now = utcnow()
    rows = [{"token": t, "kind": kind, "request_id": request_id} for t in tokens]
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    for chunk in chunked(rows):
        statement = dialect.insert(Suppression).values([r | {"created_at": now} for r in chunk])
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["token"],
                set_={
                    "lifted_at": None,
                    "lift_reason": None,
                    "lifted_by_key_id": None,
                    "created_at": statement.excluded.created_at,
                },
                where=Suppression.lifted_at.is_not(None),
            )
        )


def active(session: Session, tokens: list[str]) -> set[str]:
    """Those of `tokens` on the list and not lifted. The tokens go as one parameter (an array
    on PostgreSQL, a JSON array on SQLite): an `IN` of 5,000 parameters was built, sent and
    parsed anew for every chunk, 10-20 s of a million-row registration's screening."""
    if not tokens:
        return set()
    wanted = sorted(set(tokens))
    listed: ColumnElement[bool]
    if session.get_bind().dialect.name == "postgresql":
        listed = Suppression.token == any_(bindparam("tokens", type_=ARRAY(String)))
        params: dict[str, Any] = {"tokens": wanted}
    else:
        values = func.json_each(bindparam("tokens"))  # SQLite's JSON1, built in since 3.38
        listed = Suppression.token.in_(select(column("value")).select_from(values))
        params = {"tokens": json.dumps(wanted)}
    query = select(Suppression.token).where(listed, Suppression.lifted_at.is_(None))
    return set(session.scalars(query, params))


@dataclass(frozen=True)
class Screening:
    """Which rows of an upload name an erased sample or person: their positions, and the ids
    to name in a refusal (the client's own)."""

    rows: list[int]
    sample_ids: list[str]
    subjects: int

    def refusal(self) -> APIError:
        return APIError(
            409,
            "erased_rows_present",
            f"{len(self.rows)} row(s) belong to samples or people erased earlier; they stay "
            "out unless their suppression is lifted (POST /v1/suppressions/lift), or send "
            "on_erased=skip to register without them",
            {
                "rows": len(self.rows),
                "sample_ids": self.sample_ids[:REPORT_IDS],
                "subjects": self.subjects,
            },
        )


# The most active tokens an upload's screening holds in memory (about 6 MB), read once,
# instead of looking each chunk's tokens up (a million rows: 200 lookups of 5,000, a second
# of the registration's sealing thread). A longer list is looked up a chunk at a time.
HELD_MOST = 50_000
REMEMBERED_SUBJECTS = 50_000  # subjects whose marks a Screener keeps between chunks


def listed_now(session: Session) -> frozenset[str] | None:
    """Every token on the list and not lifted, where there are at most HELD_MOST of them."""
    on_list = Suppression.lifted_at.is_(None)
    count = session.scalar(select(func.count()).select_from(Suppression).where(on_list))
    if (count or 0) > HELD_MOST:
        return None
    return frozenset(session.scalars(select(Suppression.token).where(on_list)))


class Screener:
    """An upload's rows screened against the list a chunk at a time (a registration screens
    each chunk as it seals it, beside the previous chunk's inserts, not all before them). It
    keeps a 64-bit mark of each clean row's tokens, so `late` finds the rows of people erased
    while the upload was written: they must not come back through it (issue 55, goal 4).
    A short list is read once, at the first chunk (`listed_now`): what goes on it after that
    is what `late` finds, as it finds what goes on after any chunk's own lookup."""

    def __init__(
        self, ring: Keyring, ids: Sequence[str], subjects: Sequence[str | None], samples: bool
    ) -> None:
        self.ring, self.ids, self.subjects, self.samples = ring, ids, subjects, samples
        self.sample_marks = np.zeros(len(ids), dtype=np.uint64)  # 0: not checked, or a hit
        self.subject_marks = np.zeros(len(ids), dtype=np.uint64)
        # subjects looked up already, at most REMEMBERED_SUBJECTS (a million rows of two
        # each held half a million, 65 MB of a registration's memory)
        self._subject_marks: dict[str, int] = {}
        self._erased: set[str] = set()  # ... and found on the list
        self.rows: list[int] = []  # the hits so far, in order
        self._held: frozenset[str] | None = None  # the list, where it is short
        self._read = False  # whether the list was read (or found too long to hold)

    def chunk(self, session: Session, start: int, stop: int) -> list[int]:
        """The rows `start:stop` on the list (one keyed token per id: a few microseconds a
        row); the others' marks kept."""
        ring, subjects, seen = self.ring, self.subjects, self._subject_marks
        if len(seen) > REMEMBERED_SUBJECTS:  # looked up again if met again (`_erased` stays)
            seen.clear()
        fresh = (s for s in subjects[start:stop] if s is not None and s not in seen)
        new = list(dict.fromkeys(fresh))  # in order, each once
        subject_tokens = suppression_tokens(ring, "subject", new)
        ids = texts_at(self.ids, range(start, stop)) if self.samples else []
        sample_tokens = suppression_tokens(ring, "sample", ids)
        hit = self._on_list(session, sample_tokens + subject_tokens)
        seen.update(zip(new, _marks(subject_tokens).tolist(), strict=True))
        self._erased |= {s for s, t in zip(new, subject_tokens, strict=True) if t in hit}
        if self.samples:
            self.sample_marks[start:stop] = _marks(sample_tokens)
        self.subject_marks[start:stop] = [0 if s is None else seen[s] for s in subjects[start:stop]]
        found: list[int] = []
        if hit or self._erased:  # a subject found in an earlier chunk is not looked up again
            sampled = set(hit.intersection(sample_tokens))
            found = [
                i
                for i in range(start, stop)
                if subjects[i] in self._erased or (sampled and sample_tokens[i - start] in sampled)
            ]
            self.sample_marks[found] = 0  # a hit is not a clean row: `late` passes it by
            self.subject_marks[found] = 0
        self.rows += found
        return found

    def _on_list(self, session: Session, tokens: list[str]) -> set[str]:
        """Those of `tokens` on the list: in the list held, else looked up."""
        if not self._read:
            self._held, self._read = listed_now(session), True
        if self._held is None:
            return active(session, tokens)
        return set(self._held.intersection(tokens))

    def rest(self, session: Session, start: int) -> Screening:
        """Every row from `start` on screened too: the whole upload's report."""
        for first in range(start, len(self.ids), CHUNK):
            self.chunk(session, first, min(first + CHUNK, len(self.ids)))
        return self.screening()

    def screening(self) -> Screening:
        """The hits so far, as a refusal names them."""
        return Screening(self.rows, [self.ids[i] for i in self.rows], len(self._erased))

    def late(self, session: Session, since: datetime) -> Screening:
        """The rows checked clean whose sample or subject went on the list since `since`
        (those are few: their marks narrow the rows down, their tokens confirm each)."""
        fresh = set(
            session.scalars(
                select(Suppression.token).where(
                    Suppression.created_at >= since, Suppression.lifted_at.is_(None)
                )
            )
        )
        if not fresh:
            return Screening([], [], 0)
        marks = _marks(list(fresh))
        near = np.isin(self.sample_marks, marks) | np.isin(self.subject_marks, marks)
        ring, found, erased = self.ring, [], set()
        for i in map(int, np.flatnonzero(near)):
            subject = self.subjects[i]
            if subject is not None and suppression_token(ring, "subject", subject) in fresh:
                erased.add(subject)
                found.append(i)
            elif self.samples and suppression_token(ring, "sample", self.ids[i]) in fresh:
                found.append(i)
        return Screening(found, [self.ids[i] for i in found], len(erased))


def _marks(tokens: list[str]) -> np.ndarray:
    """64 bits of each token's MAC, decoded together (never 0: 0 marks a row not checked)."""
    raw = base64.urlsafe_b64decode("".join(t[-32:] for t in tokens))  # 24 bytes a token
    return np.frombuffer(raw, dtype="<u8").reshape(len(tokens), 3)[:, 0] | np.uint64(1)


def screen(
    session: Session,
    ring: Keyring,
    ids: Sequence[str],
    subjects: Sequence[str | None],
    samples: bool = True,
) -> Screening:
    """The rows whose sample id (where `samples`: the client's own ids) or subject is
    suppressed, a CHUNK of rows at a time: a million rows' tokens at once were 120 MB of a
    registration's memory (issue 55, goal 6)."""
    return Screener(ring, ids, subjects, samples).rest(session, 0)


def lift(
    session: Session, ring: Keyring, kind: str, raw_id: str, reason: str, key_id: int | None
) -> dict[str, Any]:
    """Take one subject or sample off the list (re-consent): the row keeps who and why."""
    lifted = lift_token(session, suppression_token(ring, kind, raw_id), reason, key_id)
    if lifted is None:
        raise APIError(404, "not_suppressed", f"no erased {kind} with this id is on the list")
    log.warning("suppression of a %s lifted by key %s: %s", kind, key_id, reason)
    return lifted


def lift_token(
    session: Session, token: str, reason: str, key_id: int | None
) -> dict[str, Any] | None:
    """Lift the suppression of `token`, if it is on the list and not lifted."""
    lifted = session.execute(
        update(Suppression)
        .where(Suppression.token == token, Suppression.lifted_at.is_(None))
        .values(lifted_at=utcnow(), lift_reason=reason, lifted_by_key_id=key_id)
        .returning(Suppression.token, Suppression.kind, Suppression.lifted_at)
    ).one_or_none()
    if lifted is None:
        return None
    return {"token": lifted.token, "kind": lifted.kind, "lifted_at": lifted.lifted_at}


def counts(session: Session) -> dict[str, int]:
    """How many tokens are on the list, and how many were lifted, per kind."""
    out = {f"{k}_{state}": 0 for k in KINDS for state in ("active", "lifted")}
    for kind, is_lifted, n in session.execute(
        select(Suppression.kind, Suppression.lifted_at.is_not(None), func.count()).group_by(
            Suppression.kind, Suppression.lifted_at.is_not(None)
        )
    ):
        out[f"{kind}_{'lifted' if is_lifted else 'active'}"] = n
    return out
