"""The suppression list: erased people and samples stay erased (GDPR practice keeps such a
list). A deletion request records the keyed tokens of the subjects it named and of every
sample id it erased, a person's rows matched by subject included (docs/concepts/ids.md);
a registration screens its rows against the list and refuses them
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
from sqlalchemy import (
    ColumnElement,
    String,
    and_,
    any_,
    bindparam,
    column,
    func,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from app.core import identity
from app.core.db.chunks import CHUNK, chunked
from app.core.db.tables import Suppression, utcnow
from app.core.errors import APIError, unprocessable
from app.core.formats.dataset_files import texts_at
from app.core.identity import DatasetIds
from app.core.storage.crypto import Keyring

log = logging.getLogger("lethe.suppression")

KINDS = ("subject", "sample")
REPORT_IDS = 100  # ids named in a refusal (the client sent them; it knows them)


def suppression_token(ring: Keyring, kind: str, text: str) -> str:
    """The keyed token of one id's canonical text on the list: dataset-independent."""
    return ring.token(f"suppressed-{kind}", 0, text)


def suppression_tokens(ring: Keyring, kind: str, texts: Sequence[str]) -> list[str]:
    """`suppression_token` of each of `texts`, made together (`Keyring.tokens`)."""
    return ring.tokens(f"suppressed-{kind}", 0, texts)


def folded_tokens(ring: Keyring, kind: str, texts: Sequence[str]) -> list[str]:
    """The any-case tokens of these canonical texts (their case folded first)."""
    return ring.tokens(f"suppressed-{kind}-folded", 0, [identity.folded(t) for t in texts])


@dataclass(frozen=True)
class Entry:
    """One token on the list. `any_case`: an erasure in a dataset whose ids ignore case put it
    there, and it keeps out every case of the id; otherwise a folded token is matched only
    by datasets that ignore case (an erased `ZZ-3` keeps out their `zz-3`, not another
    dataset's own `zz-3`)."""

    kind: str
    token: str
    any_case: bool = False
    via: str | None = None  # a sample's: the subject token whose erasure matched its row

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "token": self.token, "any_case": self.any_case}
        return out | ({"via": self.via} if self.via else {})


def entries(
    ring: Keyring,
    kind: str,
    texts: Sequence[str],
    rules: DatasetIds = DatasetIds(),
    via: str | None = None,
) -> list[Entry]:
    """What an erasure of these ids (as the dataset keeps them) puts on the list
    (docs/design/canonical-ids.md); `via`: the subject whose erasure matched these rows."""
    texts = list(dict.fromkeys(texts))
    if rules.case == "insensitive" and not rules.legacy:
        return [Entry(kind, t, True, via) for t in folded_tokens(ring, kind, texts)]
    out = [Entry(kind, t, False, via) for t in suppression_tokens(ring, kind, texts)]
    if rules.legacy:  # kept as written then: their canonical text too, where they have one
        texts = [c for c in map(_canonical_or_none, texts) if c is not None]
        out += [Entry(kind, t, False, via) for t in suppression_tokens(ring, kind, texts)]
    # the any-case companions, matched only by datasets whose ids ignore case; a kind of
    # their own, so the counts say how many ids (not tokens) are on the list
    out += [Entry(f"{kind}_folded", t, False, via) for t in folded_tokens(ring, kind, texts)]
    return list({e.token: e for e in out}.values())


def _canonical_or_none(text: str) -> str | None:
    try:
        return identity.canonical(text)
    except identity.BadId:
        return None


def suppress(
    session: Session,
    ring: Keyring,
    kind: str,
    texts: Iterable[str],
    request_id: int,
    rules: DatasetIds = DatasetIds(),
    via: str | None = None,
) -> list[dict[str, Any]]:
    """Put these ids on the list (again, where a suppression was lifted), in the caller's
    transaction; the entries, for the restore journal."""
    made = entries(ring, kind, list(texts), rules, via)
    put_tokens(session, made, request_id)
    return [e.as_json() for e in made]


def put_tokens(
    session: Session, made: Sequence[Entry], request_id: int | None, relist: bool = True
) -> None:
    """`suppress` with the entries made (a restore puts the journal's back). A lifted token put
    back (`relist`) is on the list from now (`created_at`), as is one that now keeps out
    every case: an upload's late check (`Screener.late`) finds the entries made since it
    screened, a person erased again among them. Without `relist` a token on the list, lifted
    or not, is left as it is (a backfill never undoes a lift)."""
    now = utcnow()
    rows = [
        {
            "token": e.token,
            "kind": e.kind,
            "any_case": e.any_case,
            "via_subject": e.via,
            "request_id": request_id,
        }
        for e in made
    ]
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    for chunk in chunked(rows):
        statement = dialect.insert(Suppression).values([r | {"created_at": now} for r in chunk])
        if not relist:
            session.execute(statement.on_conflict_do_nothing(index_elements=["token"]))
            continue
        wider = and_(statement.excluded.any_case, not_(Suppression.any_case))
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["token"],
                set_={
                    "lifted_at": None,
                    "lift_reason": None,
                    "lifted_by_key_id": None,
                    "any_case": or_(Suppression.any_case, statement.excluded.any_case),
                    "created_at": statement.excluded.created_at,
                },
                where=or_(Suppression.lifted_at.is_not(None), wider),
            )
        )


def active(session: Session, tokens: list[str]) -> dict[str, bool]:
    """Those of `tokens` on the list and not lifted, each with whether it keeps out every case.
    The tokens go as one parameter (an array on PostgreSQL, a JSON array on SQLite): an `IN`
    of thousands of parameters was built, sent and parsed anew for every chunk."""
    if not tokens:
        return {}
    wanted = sorted(set(tokens))
    listed: ColumnElement[bool]
    if session.get_bind().dialect.name == "postgresql":
        listed = Suppression.token == any_(bindparam("tokens", type_=ARRAY(String)))
        params: dict[str, Any] = {"tokens": wanted}
    else:
        values = func.json_each(bindparam("tokens"))  # SQLite's JSON1, built in since 3.38
        listed = Suppression.token.in_(select(column("value")).select_from(values))
        params = {"tokens": json.dumps(wanted)}
    query = select(Suppression.token, Suppression.any_case).where(
        listed, Suppression.lifted_at.is_(None)
    )
    return {t: bool(a) for t, a in session.execute(query, params)}


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
# instead of looking each chunk's tokens up. A longer list is looked up a chunk at a time.
HELD_MOST = 50_000
REMEMBERED_SUBJECTS = 50_000  # subjects whose probes a Screener keeps between chunks
SLOTS = 4  # a row's mark: 16 bits of each of at most SLOTS of its probes' tokens


def listed_now(session: Session) -> dict[str, bool] | None:
    """Every token on the list and not lifted (with `any_case`), where there are at most
    HELD_MOST of them."""
    on_list = Suppression.lifted_at.is_(None)
    count = session.scalar(select(func.count()).select_from(Suppression).where(on_list))
    if (count or 0) > HELD_MOST:
        return None
    query = select(Suppression.token, Suppression.any_case).where(on_list)
    return {t: bool(a) for t, a in session.execute(query)}


Probe = tuple[str, bool]  # a token to look for, and whether it counts only when `any_case`


@dataclass(frozen=True)
class Probes:
    """The tokens that find some ids on the list, in columns: each id's exact token, its
    any-case token, and (`others`, by position) the token of the id as Lethe wrote it before
    canonical ids. In a dataset whose ids ignore case the any-case token counts whatever
    erasure put it there; elsewhere only where that erasure ignored case."""

    exact: list[str]
    folded: list[str]
    others: dict[int, str]
    insensitive: bool

    def tokens(self) -> list[str]:
        return [*self.exact, *self.folded, *self.others.values()]

    def of(self, k: int) -> tuple[Probe, ...]:
        """Id `k`'s probes."""
        e, f = self.exact[k], self.folded[k]
        probes = ((f, False), (e, False)) if self.insensitive else ((e, False), (f, True))
        other = self.others.get(k)
        return probes if other is None else (*probes, (other, False))

    def hits(self, listed: dict[str, bool]) -> set[int]:
        """The positions of the ids on the list (none looked at when nothing is)."""
        if not listed:
            return set()
        suspects = {k for k, t in enumerate(self.exact) if t in listed}
        suspects |= {k for k, t in enumerate(self.folded) if t in listed}
        suspects |= {k for k, t in self.others.items() if t in listed}
        return {k for k in suspects if _hit(self.of(k), listed)}

    def marks(self) -> np.ndarray:
        """Each id's 64-bit mark: 16 bits of each of its tokens (`late` narrows rows by it)."""
        marks = _fragments(self.exact) | (_fragments(self.folded) << np.uint64(16))
        if self.others:
            at = np.fromiter(self.others, dtype=np.int64, count=len(self.others))
            marks[at] |= _fragments(list(self.others.values())) << np.uint64(32)
        return marks


class Prober:
    """The probes of one kind of id, for a dataset's rules (`Probes`)."""

    def __init__(self, ring: Keyring, kind: str, rules: DatasetIds) -> None:
        self.ring, self.kind, self.rules = ring, kind, rules

    def of(self, texts: Sequence[str], others: Sequence[str | None]) -> Probes:
        """The probes of these ids (`others`: each one's former writing, or None)."""
        ring, kind, rules = self.ring, self.kind, self.rules
        if rules.legacy:  # kept as written then: probed by their canonical text too
            canon = [_canonical_or_none(t) for t in texts]
            others = [t if c != t else None for t, c in zip(texts, canon, strict=True)]
            texts = [c if c is not None else t for t, c in zip(texts, canon, strict=True)]
        former = {k: o for k, o in enumerate(others) if o is not None}
        made = suppression_tokens(ring, kind, list(former.values()))
        return Probes(
            suppression_tokens(ring, kind, texts),
            folded_tokens(ring, kind, texts),
            dict(zip(former, made, strict=True)),
            rules.case == "insensitive" and not rules.legacy,
        )


def _hit(probes: tuple[Probe, ...], listed: dict[str, bool]) -> bool:
    return any(t in listed and (listed[t] or not wide) for t, wide in probes)


class Screener:
    """An upload's rows screened against the list a chunk at a time (a registration screens
    each chunk as it seals it, beside the previous chunk's inserts, not all before them). It
    keeps a 64-bit mark of each clean row's probes, so `late` finds the rows of people erased
    while the upload was written: they must not come back through it.
    A short list is read once, at the first chunk (`listed_now`): what goes on it after that
    is what `late` finds, as it finds what goes on after any chunk's own lookup."""

    def __init__(
        self,
        ring: Keyring,
        ids: Sequence[str],
        subjects: Sequence[str | None],
        samples: bool,
        rules: DatasetIds = DatasetIds(),
        written_ids: dict[int, str] | None = None,
        written_subjects: dict[int, str] | None = None,
    ) -> None:
        self.ids, self.subjects, self.samples = ids, subjects, samples
        self.sample_probes = Prober(ring, "sample", rules)
        self.subject_probes = Prober(ring, "subject", rules)
        self.written_ids = written_ids or {}
        self.written_subjects = written_subjects or {}
        self.sample_marks = np.zeros(len(ids), dtype=np.uint64)  # 0: not checked, or a hit
        self.subject_marks = np.zeros(len(ids), dtype=np.uint64)
        # each subject's mark, at most REMEMBERED_SUBJECTS (a subject owns many rows)
        self._subject_marks: dict[str, int] = {}
        self._erased: set[str] = set()  # subjects found on the list
        self.rows: list[int] = []  # the hits so far, in order
        self._held: dict[str, bool] | None = None  # the list, where it is short
        self._read = False  # whether the list was read (or found too long to hold)

    def chunk(self, session: Session, start: int, stop: int) -> list[int]:
        """The rows `start:stop` on the list (a few keyed tokens per id: microseconds a row);
        the others' marks kept."""
        subjects = texts_at(self.subjects, range(start, stop))
        new, probes = self._new_subjects(subjects, start)
        samples = self._samples(start, stop)
        wanted = (samples.tokens() if samples else []) + probes.tokens()
        listed = self._on_list(session, wanted)
        self._erased |= {new[k] for k in probes.hits(listed)}
        found = sorted(
            {start + k for k in (samples.hits(listed) if samples else ())}
            | {start + k for k, s in enumerate(subjects) if s is not None and s in self._erased}
        )
        if samples:
            self.sample_marks[start:stop] = samples.marks()
        marks = self._subject_marks
        self.subject_marks[start:stop] = [0 if s is None else marks[s] for s in subjects]
        self.sample_marks[found] = 0  # a hit is not a clean row: `late` passes it by
        self.subject_marks[found] = 0
        self.rows += found
        return found

    def _samples(self, start: int, stop: int) -> Probes | None:
        if not self.samples:
            return None
        texts = texts_at(self.ids, range(start, stop))
        others = [self.written_ids.get(i) for i in range(start, stop)]
        return self.sample_probes.of(texts, others)

    def _new_subjects(self, subjects: list[str | None], start: int) -> tuple[list[str], Probes]:
        """A chunk's subjects not met before, and their probes (their marks kept): a subject
        met in an earlier chunk and clean then is found later by `late`."""
        marks = self._subject_marks
        if len(marks) > REMEMBERED_SUBJECTS:
            marks.clear()
        new: dict[str, str | None] = {}
        for k, s in enumerate(subjects):
            if s is not None and s not in marks and s not in new:
                new[s] = self.written_subjects.get(start + k)
        names = list(new)
        probes = self.subject_probes.of(names, list(new.values()))
        marks.update(zip(names, probes.marks().tolist(), strict=True))
        return names, probes

    def _on_list(self, session: Session, tokens: list[str]) -> dict[str, bool]:
        """Those of `tokens` on the list: in the list held, else looked up."""
        if not self._read:
            self._held, self._read = listed_now(session), True
        if self._held is None:
            return active(session, tokens)
        held = self._held
        return {t: held[t] for t in tokens if t in held}

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
        (those are few: their marks narrow the rows down, their probes confirm each)."""
        fresh = {
            t: bool(a)
            for t, a in session.execute(
                select(Suppression.token, Suppression.any_case).where(
                    Suppression.created_at >= since, Suppression.lifted_at.is_(None)
                )
            )
        }
        if not fresh:
            return Screening([], [], 0)
        parts = np.array([_fragment(t) for t in fresh], dtype=np.uint64)
        near = _near(self.sample_marks, parts) | _near(self.subject_marks, parts)
        found, erased = [], set()
        for i in map(int, np.flatnonzero(near)):
            subject = self.subjects[i]
            if subject is not None:
                other = self.written_subjects.get(i)
                if _hit(self.subject_probes.of([subject], [other]).of(0), fresh):
                    erased.add(subject)
                    found.append(i)
                    continue
            if self.samples:
                probes = self.sample_probes.of([self.ids[i]], [self.written_ids.get(i)]).of(0)
                if _hit(probes, fresh):
                    found.append(i)
        return Screening(found, [self.ids[i] for i in found], len(erased))


def _fragment(token: str) -> int:
    """16 bits of a token's MAC, never 0 (0 marks an empty slot)."""
    return int(_fragments([token])[0])


def _fragments(tokens: list[str]) -> np.ndarray:
    """`_fragment` of each token, decoded together (a token's last 32 characters are the
    base64 of its 24 bytes)."""
    if not tokens:
        return np.zeros(0, dtype=np.uint64)
    raw = base64.urlsafe_b64decode("".join(t[-32:] for t in tokens))
    first = np.frombuffer(raw, dtype="<u2").reshape(len(tokens), 12)[:, 0]
    return first.astype(np.uint64) | np.uint64(1)


def _near(marks: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Rows any of whose slots holds one of these fragments (a fragment is never 0)."""
    near = np.zeros(len(marks), dtype=bool)
    for slot in range(SLOTS):
        near |= np.isin((marks >> np.uint64(16 * slot)) & np.uint64(0xFFFF), parts)
    return near


def screen(
    session: Session,
    ring: Keyring,
    ids: Sequence[str],
    subjects: Sequence[str | None],
    samples: bool = True,
    rules: DatasetIds = DatasetIds(),
) -> Screening:
    """The rows whose sample id (where `samples`: the client's own ids) or subject is
    suppressed, a CHUNK of rows at a time."""
    return Screener(ring, ids, subjects, samples, rules).rest(session, 0)


def lift(
    session: Session, ring: Keyring, kind: str, raw_id: str, reason: str, key_id: int | None
) -> dict[str, Any]:
    """Take one subject or sample off the list (re-consent), in every case and spelling that
    names it: the rows keep who and why. 404 when none of its tokens is on the list."""
    try:
        text = identity.canonical(raw_id)
    except identity.BadId as exc:
        raise unprocessable("bad_ids", f"{kind}_id: {exc}") from None
    tokens = suppression_tokens(ring, kind, list(dict.fromkeys([text, raw_id])))
    tokens += folded_tokens(ring, kind, [text])
    lifted = [done for t in tokens if (done := lift_token(session, t, reason, key_id)) is not None]
    if not lifted:
        raise APIError(404, "not_suppressed", f"no erased {kind} with this id is on the list")
    if kind == "subject":  # the person's rows matched by their erasure come back with them
        matched = session.scalars(
            select(Suppression.token).where(
                Suppression.via_subject.in_(tokens), Suppression.lifted_at.is_(None)
            )
        ).all()
        lifted += [d for t in matched if (d := lift_token(session, t, reason, key_id))]
    log.warning("suppression of a %s lifted by key %s: %s", kind, key_id, reason)
    return {**lifted[0], "tokens": [done["token"] for done in lifted]}


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
        select(Suppression.kind, Suppression.lifted_at.is_not(None), func.count())
        .where(Suppression.kind.in_(KINDS))  # not the any-case companions: one per id
        .group_by(Suppression.kind, Suppression.lifted_at.is_not(None))
    ):
        out[f"{kind}_{'lifted' if is_lifted else 'active'}"] = n
    return out
