"""POST/GET /v1/datasets: builtins by JSON, .npz and CSV by multipart upload."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from app.api.deps import (
    Admin,
    AnyRole,
    DbDep,
    DispatcherDep,
    RuntimeDep,
    SettingsDep,
    UploadsDep,
)
from app.api.limits import read_upload
from app.api.long_poll import long_poll, wait_query
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core import formats, wakeups
from app.core.db.checkpoint import checkpoint_behind
from app.core.db.session import Database
from app.core.dispatch import DELETE
from app.core.errors import APIError, unprocessable
from app.core.formats import dataset_files
from app.core.identity import DatasetIds
from app.core.jsontypes import JsonObject
from app.core.runtime import Runtime
from app.core.schemas import (
    AppendOut,
    AppendPage,
    BuiltinDatasetIn,
    DatasetOut,
    DatasetPage,
    DatasetSummary,
    IdRulesIn,
    ObjectDatasetIn,
    SamplePage,
    Text,
)
from app.core.security import Role
from app.core.services import appends
from app.core.services.datasets import dataset_view, get_dataset, list_datasets, list_samples
from app.core.services.isolated import Registration, outcome, start_isolated, wipe, wipe_upload
from app.core.services.registration import INLINE_ROWS, begin, forget_failed, rows_total
from app.core.settings import Settings
from app.core.states import append_settled

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=COMMON)

UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": BuiltinDatasetIn.model_json_schema(),
                "examples": {
                    "digits": {"value": {"builtin": "digits"}},
                    "synthetic": {
                        "value": {"builtin": "synthetic", "n_samples": 50000, "n_features": 256}
                    },
                    "corpus": {
                        "value": {"builtin": "synthetic_corpus", "vocabulary": 2000, "topics": 20}
                    },
                },
            },
            "multipart/form-data": {
                "example": {"name": "people", "label_column": "label", "id_column": "id"},
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "name": {"type": "string"},
                        "format": {
                            "type": "string",
                            "enum": ["npz", "csv", "parquet", "text_csv", "sparse_npz"],
                            "description": "text_csv: a corpus with a text column; "
                            "sparse_npz: a document-term matrix from scipy's save_npz; "
                            "parquet: a table read a row group at a time",
                        },
                        "text_column": {"type": "string", "default": "text"},
                        "min_count": {"type": "integer", "default": 1},
                        "label_column": {"type": "string", "default": "label"},
                        "id_column": {"type": "string"},
                        "subject_column": {"type": "string"},
                        "split_column": {"type": "string"},
                        "feature_columns": {
                            "type": "string",
                            "description": "csv, parquet: the feature columns, comma-separated "
                            "(default: every other numeric column; in Parquet one list column "
                            "of numbers may hold them all)",
                        },
                        "seed": {"type": "integer"},
                        "test_fraction": {"type": "number"},
                        "on_erased": {
                            "type": "string",
                            "enum": ["refuse", "skip"],
                            "default": "refuse",
                            "description": "rows of samples or people erased earlier: refuse "
                            "the registration (409), or leave them out",
                        },
                    },
                },
            },
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    responses={
        202: {
            "model": DatasetOut,
            "description": f"more than {INLINE_ROWS:,} rows: registering as a job; poll the "
            "dataset (Location) for its progress",
        },
        **errors(400, 409, 415),
    },
    openapi_extra=UPLOAD_DOC,
)
async def register_dataset(
    request: Request,
    _: Admin,
    db: DbDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    uploads: UploadsDep,
) -> JSONResponse:
    """Register a builtin (JSON `{"builtin": "digits"}`) or upload an .npz / CSV / Parquet
    file: 201 when done, or 202 with `status: registering` and `progress` once the file
    turns out to hold more than 10,000 rows (a job: poll `GET /v1/datasets/{id}`)."""
    got = await _incoming(request, settings)
    dataset_id = await run_in_threadpool(
        _begin, db, runtime, got.name, got.source, got.rows, got.rules
    )
    # parsed and sealed in a process of its own, which ends with the plaintext
    running = start_isolated(uploads, got.job(dataset_id=dataset_id), got.data)
    running.add_done_callback(lambda _: checkpoint_behind(db))  # its WAL, off the next commit
    inline = await _finished_inline(
        running, partial(_total, db, dataset_id), partial(_forget, db, dataset_id)
    )

    def view() -> JsonObject:
        with db.read() as session:
            return dataset_view(session, get_dataset(session, dataset_id))

    body = DatasetOut.model_validate(await run_in_threadpool(view)).model_dump(mode="json")
    if inline:
        return JSONResponse(body, status_code=201)
    headers = {"Location": f"/v1/datasets/{dataset_id}"}  # a job: poll it for its progress
    return JSONResponse(body, status_code=202, headers=headers)


@dataclass(frozen=True)
class Incoming:
    """What a registration or an append reads from its request: a name, the source, the
    child's job (its dataset or append id still to give), the upload's bytes, the id rules
    and the rows it holds where that is known before the parse (a synthetic builtin's)."""

    name: str
    source: str
    job: Callable[..., Registration]
    rules: DatasetIds
    data: bytes = b""
    rows: int = 0


async def _incoming(request: Request, settings: Settings) -> Incoming:
    """An upload (multipart), an object in S3 or a builtin (JSON), by the content type."""
    ctype = request.headers.get("content-type", "")
    limits = dataset_files.Limits.from_settings(settings)
    job = partial(Registration, settings, limits=limits)
    if ctype.startswith("multipart/form-data"):
        name, fmt, form, data = await _from_upload(request, settings.max_upload_bytes)
        job = partial(job, name=name, fmt=fmt, options=form.options, on_erased=form.on_erased)
        return Incoming(name, fmt, job, form.rules, data)
    if not ctype.startswith("application/json"):
        raise APIError(
            415,
            "unsupported_media_type",
            "send application/json for a builtin or multipart/form-data with a file",
        )
    raw = await request.body()
    if _names_a_source(raw):  # an object in S3, read by the registration's child
        where = _validated(ObjectDatasetIn, raw, "invalid object source")
        read_as = formats.format_named(where.format or formats.guess(where.source.s3.key))
        options = read_as.options.model_validate(
            where.model_dump(include=set(read_as.options.model_fields))
        )
        name = where.name or where.source.s3.key[-200:]
        job = partial(job, name=name, fmt=read_as.name, options=options, source=where.source)
        return Incoming(
            name, f"s3:{read_as.name}", partial(job, on_erased=where.on_erased), where.rules()
        )
    spec = _validated(BuiltinDatasetIn, raw, "invalid builtin dataset spec")
    dataset_files.check_builtin(spec, limits)
    name = spec.name or spec.builtin
    job = partial(job, name=name, fmt="builtin", builtin=spec, on_erased=spec.on_erased)
    rows = dataset_files.builtin_rows(spec)
    return Incoming(name, f"builtin:{spec.builtin}", job, spec.rules(), rows=rows)


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], raw: bytes, what: str) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise unprocessable(
            "invalid_request",
            what,
            [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()],
        ) from exc


def _names_a_source(raw: bytes) -> bool:
    """Whether a JSON body is an object source (else a builtin): its top-level keys."""
    try:
        found = json.loads(raw)
    except (ValueError, RecursionError):
        return False  # the builtin's validation says what is wrong
    return isinstance(found, dict) and "source" in found


def _begin(
    db: Database, runtime: Runtime, name: str, source: str, rows: int, rules: DatasetIds
) -> int:
    with db.write() as session:
        dataset_id = begin(session, name, source, rows, rules)
    # journaled before the client hears it: a restore never gives this id again
    runtime.journal.record_ids(datasets=dataset_id)
    return dataset_id


async def _finished_inline(
    running: Future[tuple[Any, ...]], total: Callable[[], int], forget: Callable[[], None]
) -> bool:
    """Wait for the registration (or append) while it may still finish inline: True once it
    has (an error is raised here, and its failed row forgotten: nothing is left), False as
    soon as the parse found more than INLINE_ROWS rows (it goes on as a job). A job that
    ended between two looks is still a job (202): its row tells how it ended, whether it
    failed within one poll or not."""
    waiting = asyncio.wrap_future(running)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=INLINE_POLL_SECONDS)
        if done:
            if await run_in_threadpool(total) > INLINE_ROWS:
                return False
            try:
                outcome(waiting.result())
            except APIError:
                await run_in_threadpool(forget)
                raise
            return True
        if await run_in_threadpool(total) > INLINE_ROWS:
            return False


INLINE_POLL_SECONDS = 0.05  # how often the row's total is read while the parse runs


def _total(db: Database, dataset_id: int) -> int:
    with db.read() as session:
        return rows_total(session, dataset_id)


def _forget(db: Database, dataset_id: int) -> None:
    with db.write() as session:
        forget_failed(session, dataset_id)


@dataclass(frozen=True)
class UploadForm:
    """A multipart upload's fields, checked: its format's options and what every upload says."""

    options: formats.Options
    on_erased: str
    rules: DatasetIds


async def _from_upload(request: Request, limit: int) -> tuple[str, str, UploadForm, bytes]:
    """The upload's name, format, checked fields and bytes."""
    form = await request.form(max_files=1, max_fields=20)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise unprocessable("missing_file", "multipart field 'file' is required")
    data = await read_upload(upload, limit)
    wipe_upload(upload.file)  # the spooled copy: the bytes go on in `data` alone
    if len(data) > limit:
        wipe(data)
        raise APIError(413, "payload_too_large", f"uploads are limited to {limit} bytes")
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    try:
        fmt = formats.format_named(fields.get("format") or formats.guess(upload.filename))
        name = fields.get("name") or upload.filename or "upload"
        return name, fmt.name, _upload_form(fmt, fields), data
    except APIError:
        wipe(data)
        raise


def _upload_form(fmt: formats.Format, fields: dict[str, str]) -> UploadForm:
    """The form's fields, checked: the format's options (app/core/formats), `on_erased` and
    the id rules."""
    on_erased = fields.get("on_erased", "refuse")
    if on_erased not in ("refuse", "skip"):
        raise unprocessable("invalid_request", "on_erased is refuse or skip")
    try:
        options = fmt.options_from_form(fields)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise unprocessable("invalid_request", f"invalid {fmt.name} options: {where}") from exc
    return UploadForm(options, on_erased, _rules_of(fields))


def _rules_of(fields: dict[str, str]) -> DatasetIds:
    """A form's `id_case` and `numeric_ids` (comma-separated: sample, subject)."""
    numeric = [v.strip() for v in fields.get("numeric_ids", "").split(",") if v.strip()]
    given = {"id_case": fields.get("id_case", "sensitive"), "numeric_ids": numeric}
    what = "id_case is sensitive or insensitive; numeric_ids lists sample and/or subject"
    return _validated(IdRulesIn, json.dumps(given).encode(), what).rules()


@router.get("", response_model=DatasetPage)
def list_all(
    _: AnyRole,
    db: DbDep,
    status: str | None = Query(None, pattern="^(registering|ready|failed)$"),
    offset: int = Query(0, ge=0, le=2**53),
    limit: int = Query(100, ge=1, le=1000),
) -> DatasetPage:
    """The datasets, newest first, a page at a time; `status` filters."""
    with db.read() as session:
        items, total = list_datasets(session, status=status, offset=offset, limit=limit)
    return DatasetPage(
        items=[DatasetSummary.model_validate(i) for i in items],
        total=total,
        offset=offset,
        limit=limit,
    )


@router.get("/{dataset_id}", response_model=DatasetOut, responses=errors(404))
def read_dataset(dataset_id: PathId, _: AnyRole, db: DbDep) -> JsonObject:
    with db.read() as session:
        return dataset_view(session, get_dataset(session, dataset_id))


@router.get("/{dataset_id}/samples", response_model=SamplePage, responses=errors(404))
def read_samples(
    dataset_id: PathId,
    key: AnyRole,
    db: DbDep,
    runtime: RuntimeDep,
    split: str | None = Query(None, pattern="^(train|test)$"),
    status: str | None = Query(None, pattern="^(active|erasing|erased)$"),
    subject: Text | None = Query(None, max_length=200),
    offset: int = Query(0, ge=0, le=2**53),
    limit: int = Query(100, ge=1, le=1000),
) -> SamplePage:
    with db.read() as session:
        items, total = list_samples(
            session,
            runtime.keyring,
            dataset_id,
            split=split,
            status=status,
            subject=subject,
            offset=offset,
            limit=limit,
            hide_erased=key.role not in (Role.admin, Role.auditor),
        )
        page = {"items": items, "total": total, "offset": offset, "limit": limit}
        return SamplePage.model_validate(page)


@router.post(
    "/{dataset_id}/samples",
    status_code=201,
    response_model=AppendOut,
    responses={
        202: {
            "model": AppendOut,
            "description": f"more than {INLINE_ROWS:,} rows: appending as a job; poll the append "
            "(Location) for its progress and its models' learning",
        },
        **errors(404, 409, 415),
    },
    openapi_extra=UPLOAD_DOC,
)
async def append_samples(
    dataset_id: PathId,
    request: Request,
    _: Admin,
    db: DbDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    uploads: UploadsDep,
    dispatcher: DispatcherDep,
) -> JSONResponse:
    """Append rows to a ready dataset, from the same sources as a registration:
    ids of your own are required; a row takes the split its column says, else the dataset's
    rule (a keyed hash of its id); ids the dataset holds are refused (409 `duplicate_ids`,
    listed), as are rows of erased people (`on_erased`). 201 when done, 202 with progress for
    more than 10,000 rows. Every model of the dataset then learns the rows: a `learned`
    version each (the append's `learning`)."""
    dataset_id = int(dataset_id)
    got = await _incoming(request, settings)
    append_id = await run_in_threadpool(_begin_append, db, runtime, dataset_id, got.source)
    running = start_isolated(uploads, got.job(dataset_id=dataset_id, append_id=append_id), got.data)
    dispatcher.expect()  # its models' learning follows: the worker holds off its collection

    def signal(_: object = None) -> None:  # the models learn as soon as the rows are in
        wakeups.FINISHED.wake()  # a wait on the append sees it ready (or failed) now
        checkpoint_behind(db)  # the rows' WAL, not on the learning's first commit
        try:
            with db.read() as session:
                models = appends.learners(session, append_id)
        except Exception:  # noqa: BLE001 - the reconciler signals them too
            return
        for model_id in models:
            dispatcher.enqueue(DELETE, model_id)

    running.add_done_callback(signal)
    inline = await _finished_inline(
        running,
        partial(_append_total, db, append_id),
        partial(_forget_append, db, append_id),
    )

    def view() -> JsonObject:
        with db.read() as session:
            return appends.append_view(session, appends.get_append(session, dataset_id, append_id))

    body = AppendOut.model_validate(await run_in_threadpool(view)).model_dump(mode="json")
    if inline:
        return JSONResponse(body, status_code=201)
    headers = {"Location": f"/v1/datasets/{dataset_id}/appends/{append_id}"}
    return JSONResponse(body, status_code=202, headers=headers)


@router.get("/{dataset_id}/appends", response_model=AppendPage, responses=errors(404))
def list_dataset_appends(
    dataset_id: PathId,
    _: AnyRole,
    db: DbDep,
    offset: int = Query(0, ge=0, le=2**53),
    limit: int = Query(100, ge=1, le=1000),
) -> AppendPage:
    """A dataset's appends, newest first, with each model's learning of them."""
    with db.read() as session:
        get_dataset(session, int(dataset_id))
        items, total = appends.list_appends(session, int(dataset_id), offset, limit)
    return AppendPage.model_validate(
        {"items": items, "total": total, "offset": offset, "limit": limit}
    )


@router.get("/{dataset_id}/appends/{append_id}", response_model=AppendOut, responses=errors(404))
async def read_append(
    dataset_id: PathId,
    append_id: PathId,
    _: AnyRole,
    db: DbDep,
    request: Request,
    wait: Annotated[
        float,
        wait_query("the append has failed or every model has learned its rows (or failed to)"),
    ] = 0,
) -> JsonObject:
    """One append: its progress (while it runs), its error (once failed) and its models'
    learning (a `learned` version each). With `wait`, the answer comes when the append is
    settled: a worker's commit wakes the wait (app/core/wakeups.py), so a client learns of the
    learned versions without polling."""

    def view() -> JsonObject:
        with db.read() as session:
            return appends.append_view(
                session, appends.get_append(session, int(dataset_id), int(append_id))
            )

    return await long_poll(view, _settled, request, wait)


def _settled(view: JsonObject) -> bool:
    """The append's view says its work is over (`append_settled`)."""
    learning = view["learning"]
    tasks = [t for t in learning if isinstance(t, dict)] if isinstance(learning, list) else []
    return append_settled(str(view["status"]), (str(t["status"]) for t in tasks))


def _begin_append(db: Database, runtime: Runtime, dataset_id: int, source: str) -> int:
    with db.write() as session:
        append_id = appends.begin(session, dataset_id, source)
    runtime.journal.record_ids(appends=append_id, append_dataset=dataset_id)
    return append_id


def _append_total(db: Database, append_id: int) -> int:
    with db.read() as session:
        return appends.rows_total(session, append_id)


def _forget_append(db: Database, append_id: int) -> None:
    with db.write() as session:
        appends.forget_failed(session, append_id)
