"""Appending rows to a ready dataset, a job like a registration.

`begin` makes the append's row (`registering`) before the upload is parsed; `append` (in the
upload's child process, app/core/services/isolated.py) checks the rows against the dataset (its
feature shape, its classes, ids of the client's own), refuses ids the dataset already holds
(409 with the list) and rows of erased people (app/core/services/suppression.py), gives each row
the split its column says or the dataset's rule (a keyed hash of its id against the
dataset's `test_fraction`: a row's split never depends on when it arrives), and commits the
rows a chunk at a time as `pending` (a block of rows sealed under each key, as a registration
seals them), which no model, split or request sees. Its last commit turns them active and
gives every model of the dataset a `LearnTask` (workers/learning.py), leaving out rows of
people erased while the append ran. A failed or abandoned append is discarded as a
registration is: its rows deleted and their keys destroyed.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.core import pause
from app.core.db.session import Database, rowcount
from app.core.db.tables import Dataset, DatasetAppend, LearnTask, Model, Sample, utcnow
from app.core.errors import APIError, unprocessable
from app.core.formats.dataset_files import ParsedDataset, in_form
from app.core.identity import DatasetIds
from app.core.phases import Phases
from app.core.runtime import Runtime
from app.core.services import sample_tokens
from app.core.services.registration import (
    INLINE_ROWS,
    LATE_MARGIN,
    ChunkWriter,
    Screened,
    SealedChunk,
    SubjectTokens,
    discard_job,
    insert_appended,
    screened,
    sealed_blocks,
    take_out,
)
from app.core.services.suppression import REPORT_IDS
from app.core.states import DatasetStatus, ModelStatus, SampleStatus, TaskStatus
from app.core.storage.crypto import TOKEN_PREFIX, Keyring
from app.core.storage.erasure import compact_after_erasure

log = logging.getLogger("lethe.appends")

LEARNERS = (ModelStatus.queued, ModelStatus.training, ModelStatus.ready)
# An append's rows commit in chunks of this many (a registration's are CHUNK), so one that
# answers inline (at most INLINE_ROWS rows) commits in one. Each chunk's tokens land
# all over the dataset's random-keyed token index and rewrite most of its pages, so two chunks
# wrote a million-row index twice. Since migration
# 0028 they go to the recent token table, which a merge empties off the request path.
APPEND_CHUNK = INLINE_ROWS


class AppendDiscarded(APIError):
    """The append was discarded while it ran (its progress looked stale)."""

    def __init__(self, append_id: int) -> None:
        super().__init__(
            503,
            "append_discarded",
            f"append {append_id} was discarded while it ran (no progress for too long); "
            "nothing of it was kept: send it again",
        )


def begin(session: Session, dataset_id: int, source: str) -> int:
    """The append's row, in the caller's commit; 404 for no such dataset, 409 unless it is
    ready, 422 for a corpus (its vocabulary is fixed at registration)."""
    dataset = session.get(Dataset, dataset_id)
    if dataset is None:
        raise APIError(404, "not_found", f"dataset {dataset_id} not found")
    if dataset.status != DatasetStatus.ready:
        raise APIError(
            409,
            "dataset_not_ready",
            f"dataset {dataset_id} is {dataset.status}: rows can be "
            "appended to a ready dataset only",
        )
    if dataset.kind == "text":
        raise unprocessable(
            "append_unsupported",
            "a corpus's vocabulary is fixed at registration: register a new corpus instead",
        )
    row = DatasetAppend(
        dataset_id=dataset_id,
        source=source,
        status=DatasetStatus.registering,
        progress_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row.id


def split_by_hash(ring: Keyring, dataset_id: int, ids: Sequence[str], fraction: float) -> list[str]:
    """The dataset's rule for a row that names no split: `test` when a keyed token of its id
    (an HMAC under the keyring, in a namespace of its own) read as a number in [0, 1) falls
    below `fraction`. The tokens are decoded in one call (each is 32 base64 characters, 24
    bytes, no padding) and their first 8 bytes read as big-endian integers together: a
    decode per token was a third of a 10,000-row append's split."""
    if not ids:
        return []
    start = len(TOKEN_PREFIX)
    tokens = ring.tokens("split", dataset_id, ids)
    macs = base64.urlsafe_b64decode("".join([token[start:] for token in tokens]))
    first = np.frombuffer(macs, dtype=">u8").reshape(len(tokens), 3)[:, 0]
    # uint64 -> float64 rounds to nearest as Python's int / 2**64 does (a power of two)
    tested = first.astype(np.float64) / 2.0**64 < fraction
    return np.where(tested, "test", "train").tolist()


def append(
    runtime: Runtime,
    append_id: int,
    parsed: ParsedDataset,
    on_erased: str = "refuse",
    split_given: bool = False,
    phases: Phases | None = None,
) -> list[int]:
    """Append `parsed` through the append `begin` made; the models that will learn it. On
    any failure what was committed is discarded, the append marked failed and the error
    raised. Where its time went is logged (`phases`, begun by the caller at the parse)."""
    db, ring, phases = runtime.db, runtime.keyring, phases or Phases()
    try:
        dataset_id, fraction, rules, begun = _target(db, append_id, parsed)
        parsed = in_form(parsed, rules)
        phases.mark("check")
        if not split_given:
            parsed = replace(parsed, split=split_by_hash(ring, dataset_id, parsed.ids, fraction))
        phases.mark("split")
        screening = screened(runtime, parsed, True, on_erased, rules)
        parsed, skipped = screening.parsed, screening.skipped
        phases.mark("screen")
        tokens = ring.tokens("sample", dataset_id, parsed.ids)
        with db.read() as session:
            _refuse_duplicates(session, dataset_id, parsed.ids, tokens)
        phases.mark("duplicates")
        since = (begun or utcnow()) - LATE_MARGIN
        rows = Rows(append_id, dataset_id, parsed, tokens, skipped, since)
        if len(parsed.y) <= APPEND_CHUNK:
            models = _at_once(runtime, rows, screening, phases)
        else:
            models = _in_chunks(runtime, rows, screening, phases)
        log.info("append %s: %d rows: %s", append_id, len(parsed.y), phases)
        return models
    except APIError as exc:
        discard(runtime, append_id, exc.as_json())
        raise
    except BaseException as exc:
        discard(runtime, append_id, failure(exc))
        raise


def _target(
    db: Database, append_id: int, parsed: ParsedDataset
) -> tuple[int, float, DatasetIds, datetime | None]:
    """The append's dataset (its id, test fraction and id rules; the rows checked to fit
    it) and when the append began."""
    with db.read() as session:
        dataset = session.execute(
            select(Dataset)
            .join(DatasetAppend, DatasetAppend.dataset_id == Dataset.id)
            .where(DatasetAppend.id == append_id)
        ).scalar_one()
        _check_fits(dataset, parsed)
        begun = session.scalar(
            select(DatasetAppend.created_at).where(DatasetAppend.id == append_id)
        )
    return dataset.id, dataset.test_fraction, DatasetIds.of(dataset), begun


@dataclass(frozen=True)
class Rows:
    """An append's rows once screened and checked: what its commits write."""

    append_id: int
    dataset_id: int
    parsed: ParsedDataset
    tokens: list[str]  # the rows' id tokens, in order
    skipped: int  # rows refused by the screen (`on_erased: skip`)
    since: datetime  # erasures from then on are looked for again in the last commit


def _at_once(runtime: Runtime, rows: Rows, screening: Screened, phases: Phases) -> list[int]:
    """Rows that fit in one chunk (an append answered inline): sealed, then written active
    with the append's end in one commit. Committing them `pending` first and turning them
    active in a second commit cost the UPDATE of every row and its index entries, and a
    second commit."""
    db, ring, n = runtime.db, runtime.keyring, len(rows.parsed.y)
    subjects = SubjectTokens(ring, rows.dataset_id)
    chunk = sealed_blocks(
        ring, rows.dataset_id, rows.parsed, range(n), subjects, rows.append_id, rows.tokens,
        SampleStatus.active,
    ) if n else None  # fmt: skip
    phases.mark("seal")
    with db.write() as session:
        _progress(session, rows.append_id, n_samples=n, skipped_erased=rows.skipped)
        if chunk is not None:  # (None: every row was screened out)
            insert_appended(session, ring, rows.dataset_id, chunk)
        phases.mark("write")
        late = screening.late(session, rows.since)
        models = _finish(session, ring, rows, late, pending=False)
    phases.mark("finish")
    _compact_if(late, runtime)
    return models


def _in_chunks(runtime: Runtime, rows: Rows, screening: Screened, phases: Phases) -> list[int]:
    """More rows than a chunk (a job): each chunk committed `pending` (nothing reads them)
    on a thread while the next is sealed, then the last commit turns them active."""
    db, ring, parsed = runtime.db, runtime.keyring, rows.parsed
    append_id, dataset_id = rows.append_id, rows.dataset_id
    with db.write() as session:
        _progress(session, append_id, n_samples=len(parsed.y), skipped_erased=rows.skipped)
    subjects = SubjectTokens(ring, dataset_id)

    def commit(chunk: SealedChunk, stop: int) -> None:
        with db.write(durable=False) as session:  # made durable by the last commit
            _progress(session, append_id, rows_done=stop)
            insert_appended(session, ring, dataset_id, chunk)
        pause.point(runtime.settings, "append-chunk", append_id)

    with ChunkWriter() as writer:
        for start in range(0, len(parsed.y), APPEND_CHUNK):
            stop = min(start + APPEND_CHUNK, len(parsed.y))
            # a block of rows under each key, as a registration seals them (a key and a
            # seal per row were most of an append's POST)
            chunk = sealed_blocks(
                ring, dataset_id, parsed, range(start, stop), subjects, append_id, rows.tokens
            )
            phases.mark("seal")
            writer.submit(commit, chunk, stop)
            del chunk
    phases.mark("write")  # the chunks' inserts and commits, beside the sealing
    with db.write() as session:
        late = screening.late(session, rows.since)
        models = _finish(session, ring, rows, late, pending=True)
    phases.mark("finish")
    _compact_if(late, runtime)
    return models


def _compact_if(late: list[int], runtime: Runtime) -> None:
    """After a last commit that took rows of people erased meanwhile out of their blocks: the
    keys it destroyed out of the database files too, as after any erasure (they were left in
    SQLite's WAL until some later checkpoint)."""
    if late:
        compact_after_erasure(runtime.db, runtime.settings)


def _check_fits(dataset: Dataset, parsed: ParsedDataset) -> None:
    """422 unless the rows are the dataset's kind of rows: ids of the client's own (a row
    number names nobody and would collide with the next append's), its feature shape, its
    classes."""
    if all(x == str(i) for i, x in enumerate(parsed.ids)):
        raise unprocessable(
            "ids_required",
            "appended rows need ids of your own (an id column, or `ids` in an npz): row "
            "numbers would collide with the rows already there",
        )
    shape = list(parsed.X.shape[1:])
    if shape != list(dataset.feature_shape):
        raise unprocessable(
            "feature_shape_mismatch",
            f"the rows have features of shape {shape}; dataset {dataset.id} has "
            f"{list(dataset.feature_shape)}",
        )
    labels = np.asarray(parsed.y)
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= dataset.n_classes):
        bad = int(np.flatnonzero((labels < 0) | (labels >= dataset.n_classes))[0])
        raise unprocessable(
            "unknown_label",
            f"row {bad} has label {int(labels[bad])}; dataset {dataset.id} has classes "
            f"0..{dataset.n_classes - 1}",
            {"column": "label", "row": bad},
        )


def _refuse_duplicates(
    session: Session, dataset_id: int, ids: Sequence[str], tokens: list[str]
) -> None:
    """409 `duplicate_ids`, naming them, when the dataset already holds any of these ids
    (erased rows included: an erased id is not reused)."""
    held = sample_tokens.held(session, dataset_id, tokens)
    if not held:
        return
    duplicates = [raw for raw, token in zip(ids, tokens, strict=True) if token in held]
    raise APIError(
        409,
        "duplicate_ids",
        f"{len(duplicates)} id(s) are already in dataset {dataset_id}; nothing was appended",
        {"count": len(duplicates), "ids": duplicates[: REPORT_IDS * 10]},
    )


def _progress(session: Session, append_id: int, **values: Any) -> None:
    moved = session.execute(
        update(DatasetAppend)
        .where(DatasetAppend.id == append_id, DatasetAppend.status == DatasetStatus.registering)
        .values(progress_at=utcnow(), **values)
    )
    if rowcount(moved) != 1:
        raise AppendDiscarded(append_id)


def _finish(
    session: Session, ring: Keyring, rows: Rows, late: list[int], pending: bool
) -> list[int]:
    """The append's last commit: `late`, the rows of people erased while it ran, deleted
    (keys destroyed), the rest active (the `pending` ones turned so, or all written active
    in this commit), the dataset's count raised, a learn task for each of its models; the
    models."""
    append_id, dataset_id = rows.append_id, rows.dataset_id
    if late:
        take_out(session, ring, dataset_id, [rows.tokens[i] for i in late], append_id)
    if pending:
        activated = rowcount(
            session.execute(
                update(Sample)
                .where(Sample.append_id == append_id, Sample.status == SampleStatus.pending)
                .values(status=SampleStatus.active)
            )
        )
    else:
        activated = len(rows.tokens) - len(set(late))
    finished = session.execute(
        update(DatasetAppend)
        .where(DatasetAppend.id == append_id, DatasetAppend.status == DatasetStatus.registering)
        .values(
            status=DatasetStatus.ready,
            progress_at=None,
            finished_at=utcnow(),
            n_samples=activated,
            rows_done=activated,
            skipped_erased=DatasetAppend.skipped_erased + len(late),
        )
    )
    if rowcount(finished) != 1:
        raise AppendDiscarded(append_id)
    session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id)
        .values(n_samples=Dataset.n_samples + activated)
    )
    models = list(
        session.scalars(
            select(Model.id).where(Model.dataset_id == dataset_id, Model.status.in_(LEARNERS))
        )
    )
    if activated:
        session.add_all(LearnTask(append_id=append_id, model_id=m) for m in models)
    return models if activated else []


def failure(exc: BaseException) -> dict[str, Any]:
    """What a failed append shows for an unexpected error (its detail stays in the log)."""
    return {"code": "append_failed", "message": f"the append failed ({type(exc).__name__})"}


ABANDONED = {
    "code": "append_abandoned",
    "message": "the append stopped (its process ended); nothing of it was kept: send it again",
}


def discard(runtime: Runtime, append_id: int, error: dict[str, Any]) -> None:
    """Empty a running append as a registration is (`registration.discard_job`); a finished
    append is left alone."""
    appends = DatasetAppend.__table__
    discard_job(runtime, appends, append_id, Sample.append_id == append_id, error)  # type: ignore[arg-type]


def abandoned(session: Session, now: datetime, stale_seconds: float) -> list[int]:
    """Running appends whose last chunk committed more than `stale_seconds` ago."""
    before = now - timedelta(seconds=stale_seconds)
    return list(
        session.scalars(
            select(DatasetAppend.id).where(
                DatasetAppend.status == DatasetStatus.registering,
                DatasetAppend.progress_at < before,
            )
        )
    )


def rows_total(session: Session, append_id: int) -> int:
    """The rows an append will commit: 0 until its upload is parsed."""
    found = session.scalar(select(DatasetAppend.n_samples).where(DatasetAppend.id == append_id))
    return int(found or 0)


def forget_failed(session: Session, append_id: int) -> None:
    """Delete a failed append's row: an append refused while its client waited leaves
    nothing."""
    session.execute(
        delete(DatasetAppend).where(
            DatasetAppend.id == append_id, DatasetAppend.status == DatasetStatus.failed
        )
    )


def learners(session: Session, append_id: int) -> list[int]:
    """The models with a queued learn task for this append (to signal)."""
    return list(
        session.scalars(
            select(LearnTask.model_id).where(
                LearnTask.append_id == append_id, LearnTask.status == TaskStatus.queued
            )
        )
    )


def append_view(session: Session, job: DatasetAppend) -> dict[str, Any]:
    """An append as `GET /v1/datasets/{id}/appends/{append_id}` shows it: its progress and
    each model's learning of it."""
    progress = None
    if job.status == DatasetStatus.registering:
        elapsed = max((utcnow() - job.created_at).total_seconds(), 1e-3)
        progress = {
            "rows_done": job.rows_done,
            "rows_total": job.n_samples,
            "rows_per_second": round(job.rows_done / elapsed, 1),
        }
    tasks = session.execute(
        select(LearnTask.model_id, LearnTask.status, LearnTask.version_id, LearnTask.n_added)
        .where(LearnTask.append_id == job.id)
        .order_by(LearnTask.model_id)
    ).all()
    return {
        "id": job.id,
        "dataset_id": job.dataset_id,
        "source": job.source,
        "status": job.status,
        "n_samples": job.n_samples,
        "skipped_erased": job.skipped_erased,
        "progress": progress,
        "error": job.error,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "learning": [
            {"model_id": m, "status": s, "version_id": v, "n_added": n} for m, s, v, n in tasks
        ],
    }


def get_append(session: Session, dataset_id: int, append_id: int) -> DatasetAppend:
    job = session.get(DatasetAppend, append_id)
    if job is None or job.dataset_id != dataset_id:
        raise APIError(404, "not_found", f"append {append_id} of dataset {dataset_id} not found")
    return job


def list_appends(
    session: Session, dataset_id: int, offset: int, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """A dataset's appends, newest first, a page at a time."""
    where = DatasetAppend.dataset_id == dataset_id
    total = session.scalar(select(func.count()).select_from(DatasetAppend).where(where)) or 0
    rows = session.scalars(
        select(DatasetAppend)
        .where(where)
        .order_by(DatasetAppend.id.desc())
        .offset(offset)
        .limit(limit)
    ).all()
    return [append_view(session, r) for r in rows], int(total)
