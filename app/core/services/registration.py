"""Registering a dataset a chunk of samples per commit, and discarding one that did not finish.

One transaction for a million samples held SQLite's only write lock for the whole insert
(minutes): every deletion POST waited behind it, past the busy timeout. Now the
dataset row is committed first as `registering`, each chunk is sealed with no transaction open
and committed on its own with the dataset's `progress_at`, and the dataset turns `ready` last.
No model and no deletion may use a dataset until then (409 `dataset_registering`). A
registration that fails is discarded at once; one whose process died is discarded by the
reconciler once its progress is older than `registration_stale_seconds` (`abandoned`): its
samples' data keys are destroyed with their rows, so nothing of it can be opened again, and
the dataset row stays `failed` with the error, for whoever polls it (registration
is a job; `begin` makes the row before the upload is parsed, `rows_done` counts its
progress).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import chain, repeat
from typing import Any
from uuid import UUID

import numpy as np
from sqlalchemy import ColumnElement, Connection, Table, delete, select, update
from sqlalchemy.orm import Session

from app.core import pause
from app.core.db.bulk import driver_uuids, insert_rows
from app.core.db.session import Database, rowcount
from app.core.db.tables import Base, Dataset, Sample, utcnow
from app.core.errors import APIError
from app.core.formats.dataset_files import ParsedDataset, in_form, texts_at
from app.core.formats.row_stream import release_rows
from app.core.identity import DatasetIds
from app.core.runtime import Runtime
from app.core.services import sample_tokens, subject_tokens
from app.core.services.suppression import Screener
from app.core.states import DatasetStatus, SampleStatus
from app.core.storage.crypto import (
    NONCE_BYTES,
    Keyring,
    SampleRecord,
    sample_aad,
    seal,
)
from app.core.storage.erasure import compact_after_erasure, erase_payloads
from app.core.storage.keystore import destroy_keys, new_keys, store_keys
from app.core.storage.sample_blocks import BLOCK_ROWS, block_aad, destroy_blocks, pack_columns, wipe
from app.core.webhooks import events

# Samples per commit: the longest a deletion POST waits behind a registration (more per commit
# is faster, and makes deletions wait longer; one transaction held every other writer back).
CHUNK = 5000
INLINE_ROWS = 10_000  # a registration or append of more rows answers 202 and goes on as a job
# How far before its dataset row a registration looks for suppressions it may have missed: a
# deletion's row can be stamped before its commit, and later than the screen's read.
LATE_MARGIN = timedelta(minutes=10)
SAMPLES, DATASETS = Base.metadata.tables["samples"], Base.metadata.tables["datasets"]
BLOCKS = Base.metadata.tables["sample_blocks"]
SAMPLE_COLUMNS = (
    "dataset_id",
    "external_id",
    "subject_id",
    "split",
    "payload",
    "key_id",
    "status",
    "append_id",
    "block_row",
)
TOKEN = SAMPLE_COLUMNS.index("external_id")  # a row's keyed id token
SUBJECT = SAMPLE_COLUMNS.index("subject_id")  # its subject's keyed token, or None
APPEND = SAMPLE_COLUMNS.index("append_id")


# The WAL checkpoints (pages) of the connection that inserts a registration's rows: a chunk
# rewrote index pages spread over an index of random keys (the subjects' tokens, until
# `subject_tokens` held them, migration 0027), so checkpointing after every chunk (SQLite's
# 1,000 pages) wrote the same pages again and again. Its page cache is SQLite's default 2 MB:
# 32 MB served the unique index of the rows' random id tokens, which `sample_tokens` now
# holds, filled in order, and it was 21 MiB of a million-row
# registration's peak (bench/registration.py).
INSERT_CHECKPOINT_PAGES = 25_000


class RegistrationDiscarded(APIError):
    """The dataset was discarded while it was being registered (its progress looked stale)."""

    def __init__(self, dataset_id: int) -> None:
        super().__init__(
            503,
            "registration_discarded",
            f"dataset {dataset_id} was discarded while registering (no progress for too long); "
            "nothing of it was kept: register it again",
        )


def begin(
    session: Session, name: str, source: str, rows: int = 0, rules: DatasetIds = DatasetIds()
) -> int:
    """The dataset's row, `registering` with nothing known yet but the rows where the request
    said (a synthetic builtin's) and its rules for ids, in the caller's commit: its id answers
    the client before the upload is parsed (a 202 with progress), and at once where `rows`
    makes it a job."""
    ds = Dataset(
        id_case=rules.case,
        numeric_ids=sorted(rules.numeric),
        ids_canonical=True,
        name=name,
        kind="",
        source=source,
        feature_shape=[],
        n_classes=0,
        n_samples=rows,
        status=DatasetStatus.registering,
        progress_at=utcnow(),
    )
    session.add(ds)
    session.flush()
    return ds.id


def register(
    runtime: Runtime,
    dataset_id: int,
    parsed: ParsedDataset,
    on_erased: str = "refuse",
    test_fraction: float = 0.2,
) -> int:
    """Register `parsed` into the dataset `begin` made, and return its id: the samples'
    labels, ids and float32 features sealed a block of rows under each data key, their ids
    stored only as keyed tokens. Rows of an erased sample or person (on the suppression list
    when their chunk is screened, or put on it before the last commit) are refused (409,
    nothing kept) or, `on_erased="skip"`, left out and counted (app/core/services/suppression.py).
    Each chunk is screened and sealed while the one before is written. On any failure
    what was committed is discarded, the dataset marked failed and the error raised: nothing
    half-written stays."""
    db, ring = runtime.db, runtime.keyring
    try:
        with db.read() as session:
            rules = DatasetIds.of(
                session.execute(select(DATASETS).where(DATASETS.c.id == dataset_id)).one()
            )
        parsed = in_form(parsed, rules)
        # row numbers (a builtin's, or an upload's rows numbered) are not given ids
        ids_given = not parsed.numbered and any(x != str(i) for i, x in enumerate(parsed.ids))
        # row numbers name nobody: only given ids are screened
        screener = screener_of(ring, parsed, ids_given, rules)
        refusing = on_erased != "skip" or parsed.text is not None
        if parsed.text is not None:  # a corpus's rows shaped its vocabulary: all screened first
            with db.read() as session:
                whole = screener.rest(session, 0)
            if whole.rows:
                raise whole.refusal()
        with db.write() as session:  # what the parse found: the total is known from here
            described = session.execute(
                update(DATASETS)
                .where(DATASETS.c.id == dataset_id, DATASETS.c.status == DatasetStatus.registering)
                .values(
                    kind=parsed.kind,
                    feature_shape=list(parsed.X.shape[1:]),
                    n_classes=parsed.n_classes,
                    n_samples=len(parsed.y),
                    text=parsed.text,
                    ids_given=ids_given,
                    test_fraction=test_fraction,
                    progress_at=utcnow(),
                )
            )
            if rowcount(described) != 1:
                raise RegistrationDiscarded(dataset_id)
            since = session.scalar(select(DATASETS.c.created_at).where(DATASETS.c.id == dataset_id))
        # every row is sealed, then the tokens: spilled to files meanwhile, not held
        with sample_tokens.SortedTokens() as tokens, sample_tokens.SortedTokens() as named:
            _write_rows(runtime, dataset_id, parsed, screener, refusing, tokens, named)
            release_rows(parsed.X)
            _write_tokens(db, dataset_id, tokens, named)
        with db.write() as session:
            late = screener.late(session, (since or utcnow()) - LATE_MARGIN)
            if late.rows and refusing:  # erased while this registration ran: refused as at
                raise late.refusal()  # its start
            _leave_out(session, ring, dataset_id, late.sample_ids)
            skipped = len(screener.rows) + len(late.rows)
            finished = session.execute(
                update(DATASETS)
                .where(DATASETS.c.id == dataset_id, DATASETS.c.status == DatasetStatus.registering)
                .values(
                    status=DatasetStatus.ready,
                    progress_at=None,
                    n_samples=len(parsed.y) - skipped,
                    skipped_erased=skipped,
                )
            )
            if rowcount(finished) != 1:  # discarded by the reconciler after the last chunk
                raise RegistrationDiscarded(dataset_id)
            events.dataset_ready(session, dataset_id)
    except APIError as exc:
        discard(runtime, dataset_id, exc.as_json())
        raise
    except BaseException as exc:
        discard(runtime, dataset_id, failure(exc))
        raise
    return dataset_id


def _write_rows(
    runtime: Runtime,
    dataset_id: int,
    parsed: ParsedDataset,
    screener: Screener,
    refusing: bool,
    tokens: sample_tokens.SortedTokens,
    named: sample_tokens.SortedTokens,
) -> None:
    """Every row of `parsed` committed a chunk at a time, sealed in blocks, and each committed
    row's id token into `tokens` and subject token into `named`. Each chunk is screened and
    sealed before its transaction opens, while the chunk before is written."""
    db, ring = runtime.db, runtime.keyring
    subjects = SubjectTokens(ring, dataset_id)

    def commit(chunk: SealedChunk, stop: int) -> None:
        # a chunk's commit need not wait for the disk: a registration that dies is
        # discarded, and the durable commit that makes it ready makes every chunk durable
        with db.write(durable=False) as session:
            ids = _commit_chunk(session, ring, dataset_id, chunk, stop)
            tokens.add(chunk.tokens, ids)
            pairs = subject_tokens.pairs_of(chunk.subjects, ids)
            named.add([t for t, _ in pairs], [i for _, i in pairs])
        pause.point(runtime.settings, "registration-chunk", dataset_id)  # between two commits

    with ChunkWriter() as writer:
        for start in range(0, len(parsed.y), CHUNK):
            stop = min(start + CHUNK, len(parsed.y))
            rows = _screened_chunk(runtime, screener, start, stop, refusing)
            chunk = sealed_blocks(ring, dataset_id, parsed, rows, subjects)
            writer.submit(commit, chunk, stop)
            del chunk  # the writer holds it until its commit, and no longer


def _write_tokens(
    db: Database,
    dataset_id: int,
    tokens: sample_tokens.SortedTokens,
    named: sample_tokens.SortedTokens,
) -> None:
    """The id tokens, then the subject tokens, in token order after every row: each chunk
    fills its index's end (keyed tokens are random; filled row by row, each row wrote a
    random page of the index)."""
    for gathered, insert in ((tokens, sample_tokens.insert_sorted), (named, subject_tokens.insert)):
        for pairs in gathered.chunks(CHUNK):
            with db.write(durable=False) as session:
                _progress(session, dataset_id)
                insert(session.connection(), dataset_id, pairs)


def failure(exc: BaseException) -> dict[str, Any]:
    """What a failed dataset shows for an unexpected error (its detail stays in the log)."""
    return {
        "code": "registration_failed",
        "message": f"the registration failed ({type(exc).__name__})",
    }


# what a dataset shows whose registration the reconciler discarded (its process died)
ABANDONED = {
    "code": "registration_abandoned",
    "message": "the registration stopped (its process ended); nothing of it was kept: "
    "register it again",
}


@dataclass(frozen=True)
class Screened:
    """An append's rows after its screening (`screened`): those to write, how many were left
    out, and the screener that remembers a mark of each, for the late check."""

    parsed: ParsedDataset
    skipped: int
    screener: Screener
    kept: np.ndarray | None  # the upload's positions of `parsed`'s rows; None: all of them

    def late(self, session: Session, since: datetime) -> list[int]:
        """The rows of `parsed` whose sample or subject went on the list since `since`: the
        screener's marks narrow them down, so its tokens are not made again."""
        rows = self.screener.late(session, since).rows
        if self.kept is None:
            return rows
        return np.searchsorted(self.kept, rows).tolist()  # a late row was kept: it was clean


def screener_of(
    ring: Keyring, parsed: ParsedDataset, ids_given: bool, rules: DatasetIds
) -> Screener:
    """The screen of `parsed`'s rows (in the dataset's form) against the suppression list."""
    return Screener(
        ring,
        parsed.ids,
        parsed.subjects,
        ids_given,
        rules,
        parsed.written_ids,
        parsed.written_subjects,
    )


def screened(
    runtime: Runtime,
    parsed: ParsedDataset,
    ids_given: bool,
    on_erased: str,
    rules: DatasetIds = DatasetIds(),
) -> Screened:
    """`parsed` without the rows of erased samples or people, and how many those were; a
    refusal (409) instead where `on_erased` is "refuse" or the rows shaped a corpus's
    vocabulary (left out, they would still be in it). An append's screening, all at once."""
    screener = screener_of(runtime.keyring, parsed, ids_given, rules)
    with runtime.db.read() as session:  # row numbers name nobody: only given ids are screened
        found = screener.rest(session, 0)
    if not found.rows:
        return Screened(parsed, 0, screener, None)
    if on_erased != "skip" or parsed.text is not None:
        raise found.refusal()
    keep = np.ones(len(parsed.y), dtype=bool)
    keep[found.rows] = False
    kept = np.flatnonzero(keep)
    rest = replace(
        parsed,
        X=parsed.X[keep],
        y=parsed.y[keep],
        ids=[parsed.ids[int(i)] for i in kept],
        subjects=[parsed.subjects[int(i)] for i in kept],
        split=[parsed.split[i] for i in kept],
        written_ids={},  # screened: no longer needed, and the positions moved
        written_subjects={},
    )
    return Screened(rest, len(found.rows), screener, kept)


def _screened_chunk(
    runtime: Runtime, screener: Screener, start: int, stop: int, refusing: bool
) -> Sequence[int]:
    """The rows `start:stop` to register: all of them, less those on the suppression list
    (left out), or the refusal with the whole upload's report where `refusing`."""
    with runtime.db.read() as session:
        hits = screener.chunk(session, start, stop)
        if not hits:
            return range(start, stop)
        if refusing:
            raise screener.rest(session, stop).refusal()
    gone = set(hits)
    return [i for i in range(start, stop) if i not in gone]


def _leave_out(session: Session, ring: Keyring, dataset_id: int, external_ids: list[str]) -> None:
    """Rows already written of people erased while the registration ran, taken out in its last
    commit (`take_out`)."""
    if external_ids:
        take_out(session, ring, dataset_id, ring.tokens("sample", dataset_id, external_ids))


def take_out(
    session: Session,
    ring: Keyring,
    dataset_id: int,
    tokens: list[str],
    append_id: int | None = None,
) -> None:
    """The rows these id tokens name (of that append, if one is given), in the caller's
    transaction: out of their blocks (sealed again without them, the old keys destroyed),
    then deleted with their id and subject tokens."""
    named = Sample.id.in_(sample_tokens.samples_named(dataset_id, tokens))
    query = select(Sample.subject_id, Sample.id).where(named)
    if append_id is not None:
        query = query.where(Sample.append_id == append_id)
    rows = session.execute(query).all()
    ids = [int(i) for _, i in rows]
    erase_payloads(session, ring, ids)
    session.execute(delete(Sample).where(Sample.id.in_(ids)))
    sample_tokens.delete_tokens(session, dataset_id, tokens)
    subject_tokens.delete_of(session, dataset_id, [(t, int(i)) for t, i in rows])


@dataclass
class SealedChunk:
    """A chunk of rows ready to insert, by column: the blocks' keys, the sealed blocks [(key
    id, sealed bytes)] and each block's row count, and each row's id token, subject token and
    split, in order. `rows` lays them out as SAMPLE_COLUMNS tuples (built in C by `zip`: a
    list per row and its key id converted per row were a fifth of the inserting thread)."""

    keys: list[tuple[UUID, bytes, bytes]]
    blocks: list[tuple[UUID, bytes]]
    sizes: list[int]
    tokens: list[str]
    subjects: list[str | None]
    splits: list[str]
    status: str = SampleStatus.active.value  # an append's rows are `pending` until it ends
    append_id: int | None = None

    def rows(self, dataset_id: int, key_form: Callable[[UUID], Any]) -> list[tuple[Any, ...]]:
        """The rows in SAMPLE_COLUMNS order, each block's key id in the driver's form
        (`key_form`), converted once per block."""
        key_ids = chain.from_iterable(
            repeat(key_form(key_id), size)
            for (key_id, _), size in zip(self.blocks, self.sizes, strict=True)
        )
        places = chain.from_iterable(range(size) for size in self.sizes)
        return list(
            zip(
                repeat(dataset_id),
                self.tokens,
                self.subjects,
                self.splits,
                repeat(None),
                key_ids,
                repeat(self.status),
                repeat(self.append_id),
                places,
                strict=False,  # the repeats are endless; the tokens set the length
            )
        )


def sealed_blocks(
    ring: Keyring,
    dataset_id: int,
    parsed: ParsedDataset,
    positions: Sequence[int],
    subjects: SubjectTokens,
    append_id: int | None = None,
    tokens: Sequence[str] | None = None,
    status: SampleStatus | None = None,
) -> SealedChunk:
    """The rows at `positions` (a chunk's, in order) as blocks of BLOCK_ROWS records, each
     sealed under a key of its own (app/core/storage/sample_blocks.py): one key, one seal and one
     stored key per block, where a key per row was a third of a registration's time
    . With `append_id`, that append's rows, `pending` unless
     `status` says otherwise; with `tokens`, the id tokens of all of `parsed`'s rows,
     computed already (an append's)."""
    firsts = range(0, len(positions), BLOCK_ROWS)
    keys = new_keys(ring, len(firsts))
    features = np.ascontiguousarray(_features(parsed, positions)).data.cast("B")
    width = features.nbytes // max(1, len(positions))  # bytes of one row's features
    labels = np.asarray(parsed.y)[positions].tolist()
    ids = texts_at(parsed.ids, positions)
    raw_subjects = texts_at(parsed.subjects, positions)
    encoded_ids = [x.encode() for x in ids]
    encoded_subjects = [None if x is None else x.encode() for x in raw_subjects]
    blocks: list[tuple[UUID, bytes]] = []
    for (key_id, raw, _), first in zip(keys, firsts, strict=True):
        last = min(first + BLOCK_ROWS, len(positions))
        plain = pack_columns(
            labels[first:last],
            encoded_ids[first:last],
            encoded_subjects[first:last],
            features[first * width : last * width],
        )
        blocks.append((key_id, seal(raw, plain, block_aad(dataset_id, key_id))))
        wipe(plain)
    return SealedChunk(
        keys,
        blocks,
        [min(BLOCK_ROWS, len(positions) - first) for first in firsts],
        ring.tokens("sample", dataset_id, ids) if tokens is None else texts_at(tokens, positions),
        subjects.of(raw_subjects),
        texts_at(parsed.split, positions),
        (status or (SampleStatus.active if append_id is None else SampleStatus.pending)).value,
        append_id,
    )


def _features(parsed: ParsedDataset, positions: Sequence[int]) -> np.ndarray:
    """The features of the rows at `positions`, (rows × features): one slice for a run of
    consecutive rows (a chunk with nothing left out), where a row at a time cost a Python
    call each."""
    if isinstance(positions, range) and positions.step == 1:
        return np.asarray(parsed.X[positions.start : positions.stop])
    return np.stack([parsed.X[i] for i in positions]) if positions else parsed.X[0:0]


def _progress(session: Session, dataset_id: int, **values: Any) -> None:
    """The registration's progress stamped (and `values`), or RegistrationDiscarded where the
    reconciler discarded it."""
    moved = session.execute(
        update(DATASETS)
        .where(DATASETS.c.id == dataset_id, DATASETS.c.status == DatasetStatus.registering)
        .values(progress_at=utcnow(), **values)
    )
    if rowcount(moved) != 1:
        raise RegistrationDiscarded(dataset_id)


def _commit_chunk(
    session: Session, ring: Keyring, dataset_id: int, chunk: SealedChunk, done: int
) -> list[int]:
    """One chunk's keys, blocks and rows, and the dataset's progress (`done` rows with this
    chunk), in the caller's transaction; the rows' ids, in order (their tokens go in last)."""
    _progress(session, dataset_id, rows_done=done)
    return insert_chunk(_inserting(session), ring, dataset_id, chunk)


def insert_chunk(conn: Connection, ring: Keyring, dataset_id: int, chunk: SealedChunk) -> list[int]:
    """A sealed chunk's keys, blocks and rows, not their tokens; the rows' ids in order."""
    store_keys(conn, ring, chunk.keys)
    uuid_of = driver_uuids(conn)
    insert_rows(
        conn,
        BLOCKS,
        ("key_id", "dataset_id", "data"),
        [(uuid_of(key_id), dataset_id, sealed) for key_id, sealed in chunk.blocks],
    )
    return _insert_samples(conn, dataset_id, chunk.rows(dataset_id, uuid_of), chunk.append_id)


# The page cache (KiB) of the connection that writes an append's rows (and of a token merge).
# Random-keyed tokens land all over their index, and SQLite's default cache spilled and read
# its pages again and again; 64 MB holds a million-row index. An append now writes them into
# the small recent table (app/core/services/token_merge.py).
APPEND_CACHE_KIB = 65_536


def insert_appended(session: Session, ring: Keyring, dataset_id: int, chunk: SealedChunk) -> None:
    """An append's sealed chunk and its rows' tokens, in the caller's transaction."""
    conn = _inserting(session, APPEND_CACHE_KIB)
    ids = insert_chunk(conn, ring, dataset_id, chunk)
    sample_tokens.insert_new(conn, dataset_id, chunk.tokens, ids)
    subject_tokens.insert_new(conn, dataset_id, subject_tokens.pairs_of(chunk.subjects, ids))


def _inserting(session: Session, cache_kib: int | None = None) -> Connection:
    """The session's connection, set for a registration's (or an append's) bulk inserts on
    SQLite."""
    conn = session.connection()
    if conn.dialect.name == "sqlite":  # the child that inserts ends with its connections
        conn.exec_driver_sql(f"PRAGMA wal_autocheckpoint={INSERT_CHECKPOINT_PAGES}")
        if cache_kib is not None:
            conn.exec_driver_sql(f"PRAGMA cache_size=-{int(cache_kib)}")
    return conn


def insert_sealed(
    session: Session,
    ring: Keyring,
    dataset_id: int,
    keys: list[tuple[UUID, bytes, bytes]],
    rows: list[list[Any]],
) -> None:
    """Rows sealed one by one (SAMPLE_COLUMNS order), their data keys and their tokens, in the
    caller's transaction: the layout before blocks (rows stored so still open, and erase, as
    before)."""
    conn = _inserting(session)
    ids = insert_sealed_rows(conn, ring, dataset_id, keys, rows)
    pairs = [(row[TOKEN], i) for row, i in zip(rows, ids, strict=True)]
    sample_tokens.insert_sorted(conn, dataset_id, pairs)  # the main table, as before blocks
    named = subject_tokens.pairs_of([row[SUBJECT] for row in rows], ids)
    subject_tokens.insert(conn, dataset_id, named)


def insert_sealed_rows(
    conn: Connection,
    ring: Keyring,
    dataset_id: int,
    keys: list[tuple[UUID, bytes, bytes]],
    rows: list[list[Any]],
) -> list[int]:
    """Rows sealed one by one and their data keys, not their tokens; the rows' ids in order."""
    store_keys(conn, ring, keys)
    uuid_of, at = driver_uuids(conn), SAMPLE_COLUMNS.index("key_id")
    for row, (key_id, _, _) in zip(rows, keys, strict=True):
        row[at] = uuid_of(key_id)
    append_id = rows[0][APPEND] if rows else None
    return _insert_samples(conn, dataset_id, [tuple(r) for r in rows], append_id)


def _insert_samples(
    conn: Connection, dataset_id: int, rows: list[tuple[Any, ...]], append_id: int | None
) -> list[int]:
    """`rows` (SAMPLE_COLUMNS order, key ids in the driver's form; the registration's when
    `append_id` is None, else that append's) into `samples`; their ids, in order, found
    within the caller's transaction (`sample_tokens.inserted_ids`)."""
    after = sample_tokens.last_sample_id(conn)
    insert_rows(conn, SAMPLES, SAMPLE_COLUMNS, rows)
    return sample_tokens.inserted_ids(conn, dataset_id, after, len(rows), append_id)


class ChunkWriter:
    """Commits a registration's chunks on a thread of their own, one at a time, while the
    caller seals the next: SQLite writes its pages with the interpreter lock released, so the
    sealing (Python) and the writing (the database) overlap on two cores. At most
    one chunk waits: `submit` first waits for the one before, and raises its error; leaving
    the block waits for the last (and raises its error, unless one is propagating)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lethe-chunks")
        self._pending: Future[None] | None = None

    def submit(self, commit: Callable[..., None], *args: Any) -> None:
        self.wait()
        self._pending = self._pool.submit(commit, *args)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        try:
            if error is None:
                self.wait()
            elif self._pending is not None:  # let the chunk in flight end before discarding
                self._pending.exception()
        finally:
            self._pool.shutdown(wait=True)


class Nonces:
    """Fresh GCM nonces for `count` seals, drawn in one read of the OS's generator (one
    read per row was 3% of a registration)."""

    def __init__(self, count: int) -> None:
        self._bytes, self._at = os.urandom(NONCE_BYTES * count), 0

    def next(self) -> bytes:
        at = self._at
        self._at += NONCE_BYTES
        if self._at > len(self._bytes):
            raise IndexError("more seals than nonces drawn")
        return self._bytes[at : self._at]


class SubjectTokens(dict[str, str]):
    """A dataset's subject tokens, each computed once while it is remembered: a subject owns
    many rows (at a million rows one HMAC per row was a tenth of the registration's Python).
    At most REMEMBERED_SUBJECTS are kept (a chunk's are made together, `of`): a million rows
    of two each held half a million tokens, 95 MB of a registration's memory."""

    def __init__(self, ring: Keyring, dataset_id: int) -> None:
        super().__init__()
        self.ring, self.dataset_id = ring, dataset_id

    def __missing__(self, subject: str) -> str:
        token = self[subject] = self.ring.token("subject", self.dataset_id, subject)
        return token

    def of(self, subjects: Sequence[str | None]) -> list[str | None]:
        """The tokens of a chunk's subjects (None for none), those not remembered made in one
        `Keyring.tokens` call."""
        if len(self) > REMEMBERED_SUBJECTS:
            self.clear()
        new = list(dict.fromkeys(s for s in subjects if s is not None and s not in self))
        self.update(zip(new, self.ring.tokens("subject", self.dataset_id, new), strict=True))
        return [None if s is None else self[s] for s in subjects]


REMEMBERED_SUBJECTS = 50_000


def sealed_row(
    ring: Keyring,
    dataset_id: int,
    parsed: ParsedDataset,
    i: int,
    raw: bytes,
    subjects: SubjectTokens,
    status: SampleStatus = SampleStatus.active,
    append_id: int | None = None,
    nonce: bytes | None = None,
) -> list[Any]:
    """One sample's row in SAMPLE_COLUMNS order, sealed with the raw data key `raw`; its key id
    is filled in by `insert_sealed` (in the driver's form, which needs the connection)."""
    subject = parsed.subjects[i]
    token = ring.token("sample", dataset_id, parsed.ids[i])
    record = SampleRecord(int(parsed.y[i]), parsed.ids[i], subject, parsed.X[i].tobytes())
    return [
        dataset_id,
        token,
        None if subject is None else subjects[subject],
        parsed.split[i],
        seal(raw, record.encode(), sample_aad(dataset_id, token), nonce),
        None,
        status.value,
        append_id,
        None,  # sealed on its own, in no block
    ]


def discard(runtime: Runtime, dataset_id: int, error: dict[str, Any]) -> None:
    """Empty a registering dataset (`discard_job`). A dataset that is ready is left alone."""
    discard_job(runtime, DATASETS, dataset_id, Sample.dataset_id == dataset_id, error)


def discard_job(
    runtime: Runtime, jobs: Table, job_id: int, rows_of: ColumnElement[bool], error: dict[str, Any]
) -> None:
    """Empty a registration or an append (`jobs`: the datasets or the appends) that is still
    registering: its samples' data keys and rows a chunk per commit, then its row marked
    `failed` with `error`, then compact (the destroyed keys leave the database files)."""
    db = runtime.db
    while True:
        with db.write() as session:
            status = session.scalar(select(jobs.c.status).where(jobs.c.id == job_id))
            if status != DatasetStatus.registering:
                break
            rows = session.execute(
                select(Sample.id, Sample.key_id, Sample.dataset_id)
                .add_columns(Sample.external_id, Sample.subject_id)
                .where(rows_of)
                .limit(CHUNK)
            ).all()
            if not rows:
                session.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(status=DatasetStatus.failed, error=error, progress_at=None, rows_done=0)
                )
                break
            keys = sorted({r.key_id for r in rows if r.key_id is not None})  # a block's rows
            destroy_blocks(session, keys)  # share one
            destroy_keys(session, keys)
            session.execute(delete(Sample).where(Sample.id.in_([r.id for r in rows])))
            for dataset_id in {r.dataset_id for r in rows}:  # one: the job's
                mine = [r.external_id for r in rows if r.dataset_id == dataset_id]
                sample_tokens.delete_tokens(session, dataset_id, mine)
                named = [(r.subject_id, r.id) for r in rows if r.dataset_id == dataset_id]
                subject_tokens.delete_of(session, dataset_id, named)
    compact_after_erasure(db, runtime.settings)


def rows_total(session: Session, dataset_id: int) -> int:
    """The rows a registration will commit: 0 until its upload is parsed (a synthetic
    builtin's from the start)."""
    return int(session.scalar(select(Dataset.n_samples).where(Dataset.id == dataset_id)) or 0)


def forget_failed(session: Session, dataset_id: int) -> None:
    """Delete a failed dataset's row (it holds no sample): a registration refused while its
    client still waited leaves nothing at all."""
    session.execute(
        delete(Dataset).where(Dataset.id == dataset_id, Dataset.status == DatasetStatus.failed)
    )


def abandoned(session: Session, now: datetime, stale_seconds: float) -> list[int]:
    """Registering datasets whose last chunk committed more than `stale_seconds` ago."""
    before = now - timedelta(seconds=stale_seconds)
    return list(
        session.scalars(
            select(Dataset.id).where(
                Dataset.status == DatasetStatus.registering, Dataset.progress_at < before
            )
        )
    )
