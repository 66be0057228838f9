"""The tables of DESIGN §4, plus the per-model task rows that make fan-out explicit."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    Uuid,
    false,
    or_,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, configure_mappers, mapped_column

from app.core.db.typed_json import PydanticJSON
from app.core.specs import (
    Architecture,
    ArchitectureSpec,
    PrivacyPolicy,
    StoredMethod,
    StoredTraining,
)
from app.core.states import (
    AuditStatus,
    DatasetStatus,
    DeliveryStatus,
    ExportStatus,
    ModelStatus,
    RequestStatus,
    SampleStatus,
    Stage,
    TaskStatus,
    VersionKind,
)
from app.core.wire import Progress

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


def state_column(enum: type[StrEnum], length: int, default: StrEnum | None = None) -> Any:
    """A state column (app/core/states.py): VARCHAR in the database as before (no migration, no
    CHECK constraint), the enum in Python; an unknown value is refused at flush."""
    kind = Enum(
        enum,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
        validate_strings=True,
    )
    return mapped_column(kind, default=default) if default is not None else mapped_column(kind)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class Dataset(Base):
    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))
    source: Mapped[str] = mapped_column(String(40))
    feature_shape: Mapped[list[Any]]
    n_classes: Mapped[int]
    n_samples: Mapped[int]
    # A corpus (kind "text"): its fixed vocabulary and counts (app/core/text.py); None otherwise.
    text: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Registering: samples are committed a chunk at a time, `progress_at` set with each, so
    # other writers are not locked out for the whole insert; a registration whose
    # progress stopped is discarded by the reconciler (app/core/services/registration.py).
    status: Mapped[DatasetStatus] = state_column(DatasetStatus, 12, DatasetStatus.ready)
    progress_at: Mapped[datetime | None]
    # rows left out because their person or sample had been erased (`on_erased: skip`)
    skipped_erased: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # whether its sample ids are the client's (not row numbers): only then is an erased
    # sample's id put on the suppression list (app/core/services/suppression.py)
    ids_given: Mapped[bool] = mapped_column(default=False, server_default=false())
    # a registration's progress (rows committed) and, once failed, its error
    rows_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the share of an append's rows that go to the test split when they name none: a row is
    # a test row when a keyed hash of its id falls below it (app/core/services/appends.py)
    test_fraction: Mapped[float] = mapped_column(Float, default=0.2, server_default="0.2")
    # its rules for ids (app/core/identity.py): whether case matters, which ids are numbers, and
    # whether its tokens are of canonical ids (false: registered before them, as written)
    id_case: Mapped[str] = mapped_column(
        String(12), default="sensitive", server_default="sensitive"
    )
    numeric_ids: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    ids_canonical: Mapped[bool] = mapped_column(default=True, server_default=false())


class DatasetAppend(Base):
    """Rows appended to a ready dataset: a job like a registration. Its
    rows are `pending` until it finishes; then, in one commit, they turn active and every
    model of the dataset gets a `LearnTask`. A failed or abandoned append leaves nothing."""

    __tablename__ = "dataset_appends"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), index=True
    )
    source: Mapped[str] = mapped_column(String(40))
    status: Mapped[DatasetStatus] = state_column(DatasetStatus, 12, DatasetStatus.registering)
    n_samples: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    rows_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    skipped_erased: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    progress_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class LearnTask(Base):
    """One model's learning of one append's rows: run by the model's
    deletion job once no deletion is due, as a `learned` version with its log entry."""

    __tablename__ = "learn_tasks"
    __table_args__ = (
        UniqueConstraint("append_id", "model_id", name="uq_learn_tasks_pair"),
        Index("ix_learn_tasks_model_status", "model_id", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    append_id: Mapped[int] = mapped_column(ForeignKey("dataset_appends.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    status: Mapped[TaskStatus] = state_column(TaskStatus, 10, TaskStatus.queued)
    version_id: Mapped[int | None] = mapped_column(Integer)
    certificate_id: Mapped[int | None] = mapped_column(Integer)
    n_added: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (
        Index("ix_samples_dataset_split_status", "dataset_id", "split", "status"),
        Index("ix_samples_append", "append_id"),
        Index("ix_samples_key", "key_id"),  # a block's rows, moved to its new key (0025)
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(String(200))
    subject_id: Mapped[str | None] = mapped_column(String(200))
    split: Mapped[str] = mapped_column(String(10))
    # external_id and subject_id hold keyed tokens (storage/crypto.py), never the raw ids; the
    # payload is a SampleRecord (label, raw ids, features) sealed with the sample's data key.
    payload: Mapped[bytes | None] = mapped_column(LargeBinary)
    key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    status: Mapped[SampleStatus] = state_column(SampleStatus, 10, SampleStatus.active)
    erased_at: Mapped[datetime | None]
    append_id: Mapped[int | None] = mapped_column(Integer)  # None: registered with the dataset
    # the row's place in its block (app/core/storage/sample_blocks.py): key_id is the block's key
    # and payload is NULL; None for a row sealed on its own (an appended one)
    block_row: Mapped[int | None] = mapped_column(Integer)


class SampleToken(Base):
    """A sample's id token, unique in its dataset: the lookup from a client's id to its row.
    Apart from `samples`: tokens are keyed hashes, random, and an index of
    them on `samples` took each row to a random page as it was inserted (half a million-row
    registration's insert time); here a registration writes its
    tokens last, sorted, so each commit fills the index's end. No foreign key to the sample:
    whoever deletes a sample deletes its token (`app/core/services/sample_tokens.py`)."""

    __tablename__ = "sample_tokens"
    __table_args__ = {"sqlite_with_rowid": False}
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    sample_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))


class RecentSampleToken(Base):
    """An appended sample's id token until `token_merge` moves it into `sample_tokens`: the
    same columns and key, in a table small enough that an append's random tokens touch few
    pages (10,000 into a million-row `sample_tokens` rewrote ~50 MB of its pages through the
    WAL; into this table ~0.5 MB). A token is in one of the two tables;
    every reader of tokens reads both."""

    __tablename__ = "sample_tokens_recent"
    __table_args__ = {"sqlite_with_rowid": False}
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    sample_id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"))


class SubjectToken(Base):
    """A sample's subject token (a person owns several rows): the lookup from a client's
    subject to its rows, apart from `samples` for the reason `sample_tokens` is (an
    index of the random tokens on `samples` nearly doubled a registration with subjects); a
    registration writes them last, sorted. Whoever deletes a sample deletes its subject token
    (`app/core/services/subject_tokens.py`)."""

    __tablename__ = "subject_tokens"
    __table_args__ = {"sqlite_with_rowid": False}
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    sample_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True
    )


class RecentSubjectToken(Base):
    """An appended sample's subject token until `token_merge` moves it into
    `subject_tokens` (the reason `sample_tokens_recent` is apart)."""

    __tablename__ = "subject_tokens_recent"
    __table_args__ = {"sqlite_with_rowid": False}
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    sample_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True
    )


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    architecture: Mapped[ArchitectureSpec] = mapped_column(PydanticJSON(Architecture))
    training: Mapped[StoredTraining] = mapped_column(PydanticJSON(StoredTraining))
    method: Mapped[StoredMethod] = mapped_column(PydanticJSON(StoredMethod))
    privacy: Mapped[PrivacyPolicy] = mapped_column(PydanticJSON(PrivacyPolicy))
    status: Mapped[ModelStatus] = state_column(ModelStatus, 12, ModelStatus.queued)
    progress: Mapped[Progress] = mapped_column(
        PydanticJSON(Progress), default=lambda: Progress(stage=Stage.queued)
    )
    error: Mapped[str | None] = mapped_column(Text)
    current_version_id: Mapped[int | None] = mapped_column(Integer)
    # a restore's floor for the next version number: numbers the log published are not
    # given again (app/core/services/restore.py)
    version_floor: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the training set's size at creation: a model with no version reports it in O(1)
    n_enrolled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ModelSample(Base):
    """Which samples a model was trained on, and the version/certificate that removed each."""

    __tablename__ = "model_samples"
    __table_args__ = (Index("ix_model_samples_sample", "sample_id"),)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    sample_id: Mapped[int] = mapped_column(
        ForeignKey("samples.id", ondelete="CASCADE"), primary_key=True
    )
    removed_version_id: Mapped[int | None] = mapped_column(Integer)
    removed_certificate_id: Mapped[int | None] = mapped_column(Integer)


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("model_id", "number", name="uq_model_versions_number"),
        # One child per parent: two workers can never fork a model's chain.
        UniqueConstraint("model_id", "parent_id", name="uq_model_versions_parent"),
        # The versions whose bytes are kept (migration 0017): each commit purges the model's
        # older ones, and found them by scanning every version it ever had.
        Index(
            "ix_model_versions_live",
            "model_id",
            postgresql_where=text("erased_at IS NULL"),
            sqlite_where=text("erased_at IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    number: Mapped[int]
    parent_id: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[VersionKind] = state_column(VersionKind, 12)
    weights_key: Mapped[str | None] = mapped_column(String(100))
    weights_sha256: Mapped[str] = mapped_column(String(64))
    weights_size: Mapped[int]
    state_key: Mapped[str | None] = mapped_column(String(100))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    n_train: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    erased_at: Mapped[datetime | None]


class Blob(Base):
    """A blob's row: where its sealed bytes are (`location`: database, filesystem or s3) and
    the data key that opens them. The row is the truth; an object without one is an orphan
    (storage/blobs.py). `data` holds a blob of format 1 (sealed whole, as older versions did)
    until `lethe storage migrate` moves it out; `chunk_size` is null for those."""

    __tablename__ = "blobs"
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    data: Mapped[bytes | None] = mapped_column(LargeBinary)
    key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    location: Mapped[str] = mapped_column(String(20), default="database")
    chunk_size: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BlobChunk(Base):
    """The database backend's objects: sealed bytes in pieces, so no row nears a bytea's or
    SQLite's 1 GB limit and a range reads only its pieces."""

    __tablename__ = "blob_chunks"
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    idx: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SampleStatistic(Base):
    __tablename__ = "sample_statistics"
    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    sample_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(String(30), primary_key=True)
    dtype: Mapped[str] = mapped_column(String(10))
    vector: Mapped[bytes] = mapped_column(LargeBinary)  # sealed with the sample's data key


class SampleBlock(Base):
    """BLOCK_ROWS samples' records sealed together under one data key, which names the block
    (migration 0025, app/core/storage/sample_blocks.py): erasing a row rewrites the block under a
    new key and destroys this one."""

    __tablename__ = "sample_blocks"
    key_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), index=True
    )
    data: Mapped[bytes] = mapped_column(LargeBinary)


class DataKey(Base):
    """Wrapped data keys of samples (crypto-shredding). Destroying a row erases what it
    sealed; on PostgreSQL the table is partitioned (migration 0016) so that compacting after
    an erasure rewrites only the partitions that lost keys."""

    __tablename__ = "data_keys"
    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)  # random: no RETURNING
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(16))


class ShortKey(Base):
    """Wrapped data keys of blobs and of requests' commitment openings (migration 0018): each
    dies with its version or its request, so the table stays small and compacting it is one
    small rewrite. Among the samples' keys, an update's two purged blobs' keys and its
    request's opening each cost the compaction one more partition rewritten."""

    __tablename__ = "short_keys"
    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    kek_id: Mapped[str] = mapped_column(String(16))


class Suppression(Base):
    """An erased person or sample, kept out of every later registration: the keyed
    token of the subject or sample id (HMAC under the master key, independent of the dataset:
    a team's ids are its warehouse's), never the id. Lifted by an admin with a reason
    (re-consent); the row stays, with who lifted it and why."""

    __tablename__ = "suppressions"
    token: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # subject or sample
    # an any-case token put there by a dataset whose ids ignore case (services/suppression.py)
    any_case: Mapped[bool] = mapped_column(default=False, server_default=false())
    # a sample's: the subject token whose erasure matched its row (lifted with the subject)
    via_subject: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[int | None]  # the deletion request that erased it
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    lifted_at: Mapped[datetime | None]
    lift_reason: Mapped[str | None] = mapped_column(Text)
    lifted_by_key_id: Mapped[int | None]


class Deployment(Base):
    """The database's identity and its restore journal's, one row (app/core/ledger/deployment.py):
    a database copied elsewhere keeps its identity and finds its journal by it."""

    __tablename__ = "deployment"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[str] = mapped_column(String(36))
    journal_id: Mapped[str | None] = mapped_column(String(36))
    # whether rows accepted for erasure before subject erasures listed their sample ids were
    # put on the suppression list (app/core/services/deletions.py, once)
    suppressions_backfilled: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeletionRequest(Base):
    __tablename__ = "deletion_requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    requester_key_id: Mapped[int | None] = mapped_column(Integer)
    selector: Mapped[dict[str, Any]]
    sample_ids: Mapped[list[Any]]  # internal ids resolved at acceptance
    already_erased: Mapped[list[Any]] = mapped_column(JSON, default=list)
    method: Mapped[str | None] = mapped_column(String(40))
    epsilon: Mapped[float | None] = mapped_column(Float)
    delta: Mapped[float | None] = mapped_column(Float)
    status: Mapped[RequestStatus] = state_column(RequestStatus, 10, RequestStatus.queued)
    error: Mapped[str | None] = mapped_column(Text)
    # The data key whose raw bytes are the requester's opening of the certificates' commitment
    # to the removed ids; destroyed once the request is finished.
    commitment_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # The W3C traceparent of the POST that made it (app/core/tracing.py): the worker that
    # applies the request continues its trace. Null when the API was not tracing.
    trace_context: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None]


class DeletionTask(Base):
    """One (request, model) pair: a request is done when every model it touches is done."""

    __tablename__ = "deletion_tasks"
    __table_args__ = (
        UniqueConstraint("request_id", "model_id", name="uq_deletion_tasks_pair"),
        Index("ix_deletion_tasks_model_status", "model_id", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("deletion_requests.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    status: Mapped[TaskStatus] = state_column(TaskStatus, 10, TaskStatus.queued)
    attempts: Mapped[int] = mapped_column(default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(100))
    lease_expires_at: Mapped[datetime | None]
    not_before: Mapped[datetime | None]  # after a failed attempt: retry no earlier than this
    version_id: Mapped[int | None] = mapped_column(Integer)
    certificate_id: Mapped[int | None] = mapped_column(Integer)
    n_removed: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


def task_is_due(now: datetime | ColumnElement[datetime]) -> ColumnElement[bool]:
    """A deletion task not waiting out a retry backoff (claim, reconcile and re-check agree);
    `now` a time or a bound parameter (the claim's statement is built once)."""
    return or_(DeletionTask.not_before.is_(None), DeletionTask.not_before <= now)


class Certificate(Base):
    """Append-only audit log. `body` is the canonical JSON the hash chain covers."""

    __tablename__ = "certificates"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(unique=True)
    request_id: Mapped[int] = mapped_column(Integer, index=True)
    model_id: Mapped[int] = mapped_column(Integer, index=True)
    from_version: Mapped[int | None]
    to_version: Mapped[int]
    method: Mapped[str] = mapped_column(String(40))
    # a string, not the enum: the log keeps whatever earlier versions wrote (append-only)
    guarantee: Mapped[str] = mapped_column(String(12))
    # NULL for a heuristic method (guarantee `none`): it makes no privacy claim.
    epsilon: Mapped[float | None] = mapped_column(Float)
    delta: Mapped[float | None] = mapped_column(Float)
    cumulative_epsilon: Mapped[float | None] = mapped_column(Float)
    cumulative_delta: Mapped[float | None] = mapped_column(Float)
    n_removed: Mapped[int]
    body: Mapped[str] = mapped_column(Text)
    # Measured constants that are functions of the removed data, with the salts of the body's
    # commitments to them: shown to auditors and admins only, never hashed into the log
    # . Canonical JSON {name: {"value": v, "salt": hex}}.
    restricted: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    prev_hash: Mapped[str] = mapped_column(String(64), unique=True)
    entry_hash: Mapped[str] = mapped_column(String(64), unique=True)


class MerkleNode(Base):
    """A complete subtree of the certificates' Merkle tree (RFC 6962): level 0 holds the leaf
    of certificate seq = idx + 1; level l, index i covers leaves [i·2^l, (i+1)·2^l)."""

    __tablename__ = "merkle_nodes"
    level: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    )
    hash: Mapped[str] = mapped_column(String(64))


class PrivacyAudit(Base):
    """An empirical privacy audit of a model's certificates: its options, where it
    stands, and its result (aggregate figures only: the canaries, the shadow model and the
    scores never reach the database). `certificate_id` is its entry in the audit log."""

    __tablename__ = "privacy_audits"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    requester_key_id: Mapped[int | None] = mapped_column(Integer)
    options: Mapped[dict[str, Any]]
    status: Mapped[AuditStatus] = state_column(AuditStatus, 10, AuditStatus.queued)
    stage: Mapped[str | None] = mapped_column(String(40))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    certificate_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class PublishedCheckpoint(Base):
    """A checkpoint the log published (C2SP tlog-checkpoint): the signed note with
    the witnesses' cosignatures it gathered, once a quorum cosigned it."""

    __tablename__ = "checkpoints"
    tree_size: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    )
    note: Mapped[str] = mapped_column(Text)
    cosigners: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PublicNode(Base):
    """A complete subtree of the public log's tree: the same shape as `merkle_nodes`
    but its leaf i is SHA-256(0x00 ‖ SHA-256(body of certificate i + 1)), so the public tiles
    and entries reveal that a certificate was logged, never what it says."""

    __tablename__ = "public_nodes"
    level: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    idx: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    )
    hash: Mapped[str] = mapped_column(String(64))


class TreeHead(Base):
    """A signed tree head: Ed25519 over (tree size, root hash, timestamp) by key `key_id`."""

    __tablename__ = "tree_heads"
    tree_size: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=False
    )
    root_hash: Mapped[str] = mapped_column(String(64))
    timestamp: Mapped[str] = mapped_column(String(40))
    key_id: Mapped[str] = mapped_column(String(32))
    signature: Mapped[str] = mapped_column(String(128))


class ApiKey(Base):
    __tablename__ = "api_keys"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(12))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class WorkerHeartbeat(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(100), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int]
    mode: Mapped[str] = mapped_column(String(12))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookEndpoint(Base):
    """A receiver of Lethe's events: its URL, the event types it wants (empty: all),
    its signing secret wrapped under the master key (and, during a rotation, the previous one
    until `previous_until`), and whether it was disabled after repeated failures."""

    __tablename__ = "webhook_endpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(2000))
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    description: Mapped[str] = mapped_column(String(200), default="")
    allow_private: Mapped[bool] = mapped_column(default=False)
    secret_wrapped: Mapped[bytes] = mapped_column(LargeBinary)
    previous_secret_wrapped: Mapped[bytes | None] = mapped_column(LargeBinary)
    previous_until: Mapped[datetime | None]
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    disabled_at: Mapped[datetime | None]
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint (the outbox): written in the commit that made the
    event, sent at least once by the API's sender, its attempts logged here."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True
    )
    message_id: Mapped[str] = mapped_column(String(40))
    event_type: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[DeliveryStatus] = state_column(DeliveryStatus, 10, DeliveryStatus.pending)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_attempt_at: Mapped[datetime | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]


class MlflowExport(Base):
    """A model version's copy in MLflow (app/core/mlflow_export/): which MLflow model
    version and run hold it, and whether its artifact was deleted after Lethe purged it. A row
    is the claim of one syncer: made before the upload, with `next_attempt_at` as its lease."""

    __tablename__ = "mlflow_exports"
    version_id: Mapped[int] = mapped_column(
        ForeignKey("model_versions.id", ondelete="CASCADE"), primary_key=True
    )
    model_id: Mapped[int] = mapped_column(Integer, index=True)
    status: Mapped[ExportStatus] = state_column(ExportStatus, 10, ExportStatus.pending)
    registered_model: Mapped[str | None] = mapped_column(String(200))
    mlflow_version: Mapped[str | None] = mapped_column(String(20))
    run_id: Mapped[str | None] = mapped_column(String(64))
    artifact_uri: Mapped[str | None] = mapped_column(String(1000))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text)
    seconds: Mapped[float | None] = mapped_column(Float)
    registered_at: Mapped[datetime | None]
    purged_at: Mapped[datetime | None]


# Mappers configured now rather than on the first query: every process that imports the tables
# queries them, and an upload's child, forked from a fork server that imported this module
# (app/core/services/isolated.py), inherits them configured instead of configuring them again on its
# first query (on every registration's and append's path).
configure_mappers()
