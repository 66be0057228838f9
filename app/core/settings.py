"""Service configuration, read from LETHE_* environment variables (pydantic-settings)."""

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The service's memory bound for one dataset's rows: every process of the service together
# peaks within MEMORY_PER_DATA_BYTE × the rows' float32 bytes + MEMORY_RESERVE_BYTES (the
# interpreters, torch, the database's caches); the default size limits derive from it.
MEMORY_PER_DATA_BYTE = 1.5
MEMORY_RESERVE_BYTES = 2**30
FLOAT32_BYTES = 4
ROW_BYTES = 200  # a row's ids, tokens and label held beside its features (declared)


class Settings(BaseSettings):
    """All knobs of a Lethe deployment. No Redis URL means embedded mode (SQLite, one worker)."""

    model_config = SettingsConfigDict(env_prefix="LETHE_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".lethe"), description="Where the embedded SQLite file lives.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/lethe.db"
    )
    redis_url: str | None = Field(None, description="Redis URL; unset = embedded mode.")
    queue_name: str = "lethe"
    embedded_worker: Literal["process", "thread"] = Field(
        "process",
        description="Embedded mode's worker: a child process of the API (its own interpreter "
        "lock: the request path keeps its pace while updates run) or a thread of the API "
        "process (one process; tests that patch jobs in-process use it).",
    )
    max_upload_bytes: int = Field(64 * 1024 * 1024, description="Largest accepted upload.")
    max_dataset_samples: int | None = Field(
        None,
        ge=1,
        description="Most samples in one dataset. Default: what this machine's memory holds "
        "at the service's bound (`dataset_sample_limit`).",
    )
    max_json_bytes: int = Field(
        8 * 1024 * 1024,
        description="Largest request body on every route but the uploads, counted while it "
        "streams (chunked bodies too); room for a deletion of 100,000 ids of ~80 characters.",
    )
    max_features_per_sample: int = Field(
        65_536, description="Most features per sample (the product of X.shape[1:])."
    )
    max_dataset_cells: int | None = Field(
        None,
        ge=1,
        description="Most samples x features in one dataset (npz, CSV, Parquet, synthetic). "
        "Default: what this machine's memory holds at the service's bound "
        "(`dataset_cell_limit`).",
    )
    max_npz_bytes: int = Field(
        1024 * 1024 * 1024,
        description="Most uncompressed bytes read from the arrays of one uploaded .npz.",
    )
    max_job_memory_bytes: int | None = Field(
        None,
        ge=1,
        description="Most memory one training or update job may be estimated to need "
        "(app/core/services/memory.py); a model over it is refused at creation. Default: half the "
        "machine's physical memory.",
    )
    lease_seconds: float = Field(60.0, description="A worker's claim on a model expires after.")
    heartbeat_seconds: float = 10.0
    reconcile_seconds: float = Field(5.0, description="Reconciler period.")
    plaintext_ttl_seconds: float = Field(
        60.0,
        gt=0.0,
        description="a worker process that may hold erased rows in freed memory gives way to "
        "a fresh one within this long after an erasure finishes",
    )
    registration_stale_seconds: float = Field(
        120.0,
        gt=0,
        description="A registering dataset whose last chunk committed longer ago than this is "
        "discarded by the reconciler (its process died): its samples' keys and rows go.",
    )
    max_batch_requests: int = Field(256, description="Most deletion requests applied at once.")
    resident_models: int = Field(
        2,
        ge=0,
        le=64,
        description="Models whose retained rows and noise-free state a worker keeps in memory "
        "between updates (workers/resident.py); 0 reads everything at every update.",
    )
    sticky_seconds: float = Field(
        1.0,
        ge=0.0,
        le=60.0,
        description="Distributed workers only: how long a worker keeps a model's lease after "
        "its last batch, watching for the model's next request, so that the worker holding "
        "the warm session applies it (0: release at once).",
    )
    blob_store: Literal["filesystem", "database", "s3"] = Field(
        "filesystem",
        description="Where weights and noise-free states live, sealed in chunks "
        "(storage/blobs.py): filesystem = <blob_dir> (the embedded default; in distributed "
        "mode every process must mount the same folder), database = rows of blob_chunks, "
        "s3 = an S3-compatible bucket (LETHE_S3_*).",
    )
    blob_dir: Path | None = Field(None, description="default <data_dir>/blobs")
    journal_dir: Path | None = Field(
        None,
        description="the restore journal, kept apart from the database's backups; default "
        "$XDG_STATE_HOME/lethe/journal (~/.local/state/lethe/journal): outside the data folder, "
        "so a backup of that folder never restores it (docs/operations/backups.md)",
    )
    blob_chunk_bytes: int = Field(
        1 << 20, ge=4096, le=64 << 20, description="Plaintext bytes per sealed chunk of a blob."
    )
    blob_orphan_grace_seconds: float = Field(
        900.0,
        ge=0.0,
        description="An object no blob row references is swept once it is this old: longer "
        "than any write-then-commit of a job (a lease is 60 s).",
    )
    token_merge_rows: int = Field(
        50_000,
        gt=0,
        description="Appended rows' tokens wait in small tables until there are this many, "
        "then move into the main indexes while no append, registration or learning runs "
        "(at 4 times as many, regardless); see app/core/services/token_merge.py.",
    )
    blob_sweep_seconds: float = Field(
        300.0, gt=0.0, description="How often the reconciler sweeps orphaned objects."
    )
    webhook_poll_seconds: float = Field(
        0.2, gt=0.0, description="How often the API's webhook sender looks for due deliveries."
    )
    webhook_timeout_seconds: float = Field(
        10.0, gt=0.0, description="One webhook POST's timeout (connect, read and write)."
    )
    webhook_retry_hours: float = Field(
        24.0, gt=0.0, description="How long a webhook delivery is retried before it fails."
    )
    webhook_backoff_seconds: float = Field(
        2.0, gt=0.0, description="The first retry's delay; doubled per attempt, with jitter."
    )
    webhook_disable_after: int = Field(
        50, ge=1, description="Consecutive failed attempts after which an endpoint is disabled."
    )
    trace_sql: bool = Field(
        True,
        description="With OTEL_EXPORTER_OTLP_ENDPOINT set: a span per SQL statement too "
        "(SQLAlchemy's instrumentation).",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="An MLflow tracking server (e.g. http://mlflow:5000): every published version "
        "is registered there and a purged one's artifact deleted (needs the `mlflow` extra).",
    )
    mlflow_model_prefix: str = Field(
        "lethe-model-", description="MLflow's registered model for Lethe model N: <prefix>N."
    )
    mlflow_experiment: str = Field(
        "lethe", description="The MLflow experiment whose runs hold the versions' weights."
    )
    mlflow_poll_seconds: float = Field(
        1.0, gt=0.0, description="How often the API's MLflow syncer looks for versions to copy."
    )
    s3_bucket: str | None = Field(None, description="The bucket (created when missing).")
    s3_prefix: str = Field("", description="Prefix of every object key, e.g. 'lethe/'.")
    s3_endpoint_url: str | None = Field(
        None, description="e.g. http://seaweedfs:8333 or https://<account>.r2.cloudflarestorage.com"
    )
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    job_timeout_seconds: int = 3600
    signal_ttl_seconds: int = Field(
        60, ge=1, description="A waiting queue signal de-duplicates others this long at most."
    )
    job_retries: int = Field(
        3, ge=0, le=20, description="retries of a failed update before its requests fail"
    )
    retry_backoff_seconds: list[int] = Field(
        [2, 10, 30], description="wait before retry k (the last repeats); kept in the database"
    )
    worker_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="`lethe worker` serves its Prometheus metrics here"
    )
    pause_dir: Path | None = Field(
        None, description="tests only: folder of named pause points (app/core/pause.py)"
    )
    pause_at: list[str] = Field([], description="tests only: the pause points that hold")
    master_key: SecretStr | None = Field(
        None, description="base64 of 32 bytes: wraps every data key (crypto-shredding)"
    )
    master_key_file: Path | None = Field(
        None, description="file holding the master key; default <data_dir>/master.key"
    )
    audit_signing_key: SecretStr | None = Field(
        None, description="base64 of 32 bytes: the Ed25519 seed that signs the audit tree heads"
    )
    audit_signing_key_file: Path | None = Field(
        None, description="file holding it; default <data_dir>/audit-signing.key"
    )
    log_origin: str = Field(
        "localhost/lethe/audit",
        pattern=r"^[^\s+]+$",
        description="The log's origin (C2SP tlog-checkpoint), also its key name: set it to "
        "<your host>/lethe/<log name> before anyone pins the log's vkey.",
    )
    log_witnesses: list[str] = Field(
        [],
        description="Witnesses (C2SP tlog-witness) a checkpoint must be cosigned by before it "
        "is published: each '<submission URL prefix> <witness vkey>'.",
    )
    log_witness_quorum: int | None = Field(
        None, ge=0, description="How many of them must cosign (default: all)."
    )
    witness_timeout_seconds: float = Field(5.0, gt=0, description="Per witness request.")
    checkpoint_interval_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        description="After an update, the log publishes a checkpoint of its new head at most "
        "this often (a later head waits for the next one; receipts need a published one).",
    )
    erasure_compaction: bool = Field(
        True, description="after an erasure, compact the key table (VACUUM FULL / checkpoint)"
    )
    compaction_interval_seconds: float = Field(
        1.0,
        ge=0,
        le=60,
        description="PostgreSQL: the first erasure after a quiet spell is compacted at once; "
        "keys destroyed within this long of a compaction's start wait until then, and are "
        "compacted together (at most one run per interval; 0: one run after another)",
    )
    key_cache_seconds: float = Field(
        2.0,
        ge=0,
        le=60,
        description="How long the API remembers a verified key; a revocation in another API "
        "process takes effect within this (0: look every key up).",
    )
    weights_cache_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="Memory for released weights served by the API."
    )
    torch_threads: int = 0
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where workers compute (models, data, per-sample statistics): auto = the "
        "GPU when torch sees one, else the CPU; cuda = a GPU or the worker refuses to start.",
    )
    bootstrap_admin_key: bool = Field(True, description="Create an admin key on first start.")
    metrics_access: Literal["key", "token", "public", "off"] = Field(
        "key",
        description="Who may read /metrics: key = an admin or auditor API key as Bearer; "
        "token = `Authorization: Bearer <LETHE_METRICS_TOKEN>` (for a Prometheus scraper); "
        "public = anyone; off = 404.",
    )
    metrics_token: SecretStr | None = Field(
        None, description="The scraper's bearer token when metrics_access is 'token'."
    )

    @model_validator(mode="after")
    def _metrics_token_given(self) -> "Settings":
        token = self.metrics_token.get_secret_value().strip() if self.metrics_token else ""
        if self.metrics_access == "token" and len(token) < 16:
            raise ValueError(
                "LETHE_METRICS_ACCESS=token needs LETHE_METRICS_TOKEN (at least 16 characters)"
            )
        return self

    @model_validator(mode="after")
    def _s3_bucket_given(self) -> "Settings":
        if self.blob_store == "s3" and not self.s3_bucket:
            raise ValueError("LETHE_BLOB_STORE=s3 needs LETHE_S3_BUCKET")
        return self

    @model_validator(mode="after")
    def _witnesses_parse(self) -> "Settings":
        for entry in self.log_witnesses:
            url, _, vkey = entry.strip().partition(" ")
            if not url.startswith(("http://", "https://")) or vkey.count("+") < 2:
                raise ValueError(f"LETHE_LOG_WITNESSES: {entry!r} is not '<url> <vkey>'")
        if (self.log_witness_quorum or 0) > len(self.log_witnesses):
            raise ValueError("LETHE_LOG_WITNESS_QUORUM is larger than the witnesses named")
        return self

    @property
    def witness_quorum(self) -> int:
        q = self.log_witness_quorum
        return len(self.log_witnesses) if q is None else q

    @property
    def resolved_journal_dir(self) -> Path:
        if self.journal_dir is not None:
            return self.journal_dir
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(state) / "lethe" / "journal"

    @property
    def journal_in_data_dir(self) -> bool:
        """Whether the journal lies inside the data folder, where a backup of the folder
        would restore it with the database (and hide the rollback)."""
        journal, data = self.resolved_journal_dir.resolve(), self.data_dir.resolve()
        return journal == data or data in journal.parents

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir or self.data_dir / "blobs"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'lethe.db').resolve()}"

    @property
    def job_memory_limit(self) -> int:
        """`max_job_memory_bytes`, or half the physical memory when it is not set."""
        if self.max_job_memory_bytes is not None:
            return self.max_job_memory_bytes
        return physical_memory() // 2

    @property
    def dataset_cell_limit(self) -> int:
        """`max_dataset_cells`, or the most float32 values whose dataset stays within the
        service's memory bound on this machine: every process together peaks at
        MEMORY_PER_DATA_BYTE × the data + MEMORY_RESERVE_BYTES (docs/operations/capacity.md)."""
        if self.max_dataset_cells is not None:
            return self.max_dataset_cells
        return int(_memory_for_data() / (MEMORY_PER_DATA_BYTE * FLOAT32_BYTES))

    @property
    def dataset_sample_limit(self) -> int:
        """`max_dataset_samples`, or the most rows of one feature within that bound, each
        with its ids and label beside its features (ROW_BYTES)."""
        if self.max_dataset_samples is not None:
            return self.max_dataset_samples
        return int(_memory_for_data() / (MEMORY_PER_DATA_BYTE * (FLOAT32_BYTES + ROW_BYTES)))

    @property
    def embedded(self) -> bool:
        return not self.redis_url


def physical_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _memory_for_data() -> int:
    return max(0, physical_memory() - MEMORY_RESERVE_BYTES)


def get_settings() -> Settings:
    """The environment's settings, read now: for the entry points only (`lethe` commands,
    `create_app()` without settings), which build a Runtime from them and pass that on."""
    return Settings()
