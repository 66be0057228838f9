"""The API's answers as light pydantic models (no torch, scipy or dp-accounting): the server's
response models and what the client (`lethe_client.client`) parses; the server
(`app.core.wire`) uses the same models, so the two cannot drift (the client ships without the
server).

The open-ended documents (a certificate, the preview, the chain check) are typed on the keys
every one of them has and keep the rest (`extra="allow"`): a method adds its own constants
and preview extras.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from lethe_client.jsontypes import JsonObject
from lethe_client.specs import Architecture, PrivacyPolicy, StoredMethod, StoredTraining
from lethe_client.states import (
    AuditStatus,
    ExportStatus,
    ModelStatus,
    RequestStatus,
    SampleStatus,
    Stage,
    TaskStatus,
    VersionKind,
)


class Out(BaseModel):
    """A response read from the database's rows."""

    model_config = ConfigDict(from_attributes=True, use_attribute_docstrings=True)


class HealthOut(BaseModel):
    """`GET /healthz`: the process answers."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    status: str
    """Always "ok" when the process answers; readiness (database, queue) is `/readyz`."""


class RegistrationProgress(Out):
    """How far a registration has come (registration is a job)."""

    rows_done: int
    """rows sealed and committed"""
    rows_total: int
    """rows the upload holds (0 until it is parsed)"""
    rows_per_second: float
    """rows committed per second since the registration began"""


class DatasetSummary(Out):
    """A dataset as the list shows it: what it is and its status (counts per split and
    status are on `GET /v1/datasets/{id}`: they count its rows)."""

    id: int
    """the dataset's id"""
    name: str
    """display name"""
    kind: str
    """image, tabular or text"""
    source: str
    """builtin:<name>, npz, csv, parquet, s3:<format>, text_csv or sparse_npz"""
    feature_shape: list[int]
    """shape of one sample's features"""
    n_classes: int
    """number of classes"""
    n_samples: int
    """samples registered (while registering: the samples it will hold)"""
    status: str
    """registering (samples are still being committed, a chunk at a time: models and
    deletions on it are refused with 409 until it is ready), ready, or failed"""
    progress: RegistrationProgress | None = None
    """while registering: rows done, the total and the rate"""
    created_at: datetime
    """when it was registered (UTC)"""


class DatasetOut(DatasetSummary):
    """A registered dataset: what the list shows, and its sample counts."""

    counts: dict[str, int] | None = None
    """samples per split and per status (active, erased); null while it registers (its
    `progress` says how many rows are in)"""
    skipped_erased: int = 0
    """rows left out at registration: their sample or person had been erased (on_erased=skip)"""
    error: JsonObject | None = None
    """once failed: why (its rows and keys are gone)"""
    text: JsonObject | None = None
    """a corpus's vocabulary size, rare token and short documents (null otherwise)"""
    ids: JsonObject = {}
    """how its ids are read: `id_case` (sensitive or insensitive), `numeric_ids` (which ids
    are numbers) and `canonical` (false: registered before canonical ids, kept as written)"""


class Learning(Out):
    """One model's learning of an append's rows."""

    model_id: int
    """the model"""
    status: str
    """queued, running, done or failed"""
    version_id: int | None = None
    """the `learned` version, once done"""
    n_added: int = 0
    """rows the model learned (its training rows among the append's)"""


class AppendOut(Out):
    """Rows appended to a dataset: a job like a registration, then each of the
    dataset's models learns them."""

    id: int
    """the append's id"""
    dataset_id: int
    """the dataset the rows joined"""
    source: str
    """npz, csv, parquet or s3:<format>"""
    status: str
    """registering (rows still being committed: no model sees them yet), ready, or failed
    (nothing of it was kept)"""
    n_samples: int
    """rows appended (while registering: rows the upload holds)"""
    skipped_erased: int = 0
    """rows left out: their sample or person had been erased"""
    progress: RegistrationProgress | None = None
    """while registering: rows done, the total and the rate"""
    error: JsonObject | None = None
    """once failed: why"""
    created_at: datetime
    """when it was sent (UTC)"""
    finished_at: datetime | None = None
    """when its rows turned active (UTC)"""
    learning: list[Learning] = []
    """each model of the dataset and its learning of these rows"""


class AppendPage(Out):
    """A page of a dataset's appends, newest first."""

    items: list[AppendOut]
    """the appends"""
    total: int
    """the dataset's appends"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""


class DatasetPage(Out):
    """A page of the datasets, newest first."""

    items: list[DatasetSummary]
    """the datasets"""
    total: int
    """datasets matching the filter"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""


class SampleOut(Out):
    """A sample as readers see it; once erased its ids and label are gone (null)."""

    external_id: str | None
    """the client's id (null once erased)"""
    subject_id: str | None
    """the data subject's id, if any (null once erased)"""
    split: str
    """train or test"""
    label: int | None
    """the label (null once erased)"""
    status: SampleStatus
    """active or erased"""
    erased_at: datetime | None
    """when it was erased"""


class SamplePage(Out):
    """A page of a dataset's samples."""

    items: list[SampleOut]
    """the samples"""
    total: int
    """samples matching the filter"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""


class MlflowCopyOut(Out):
    """Where a version went in MLflow (when Lethe is configured with a tracking
    server)."""

    status: ExportStatus
    """pending (being copied or retried), registered, purged (its artifact deleted from MLflow)
    or skipped (purged before it was ever copied)"""
    registered_model: str | None
    """MLflow's registered model, `lethe-model-<id>` by default"""
    version: str | None
    """the MLflow model version"""
    run_id: str | None
    """the MLflow run whose artifact `weights/model.safetensors` holds the weights"""
    attempts: int
    """failed attempts so far"""
    seconds: float | None
    """how long its registration took (upload, model version, alias)"""
    last_error: str | None
    """why the last attempt failed"""
    registered_at: datetime | None
    """when its copy was made"""
    purged_at: datetime | None
    """when its artifact was deleted from MLflow"""


class VersionOut(Out):
    """One version of a model: the trained model or an update."""

    number: int
    """1 for the trained model, then one per update"""
    parent: int | None
    """the version it replaced"""
    kind: VersionKind
    """trained, unlearned, retrained, imported or learned (rows appended)"""
    weights_sha256: str
    """sha256 of the released safetensors bytes"""
    weights_size: int
    """bytes of the released file"""
    weights_available: bool
    """false once purged (it was trained on erased data)"""
    metrics: JsonObject
    """accuracies, timings, σ and what the method measured"""
    n_train: int
    """training samples it holds"""
    created_at: datetime
    """when it was written (UTC)"""
    erased_at: datetime | None
    """when its weights were purged"""
    mlflow: MlflowCopyOut | None = None
    """its copy in MLflow, when Lethe copies versions there"""


class Progress(BaseModel):
    """Training progress: the stage, and while training the epoch and the last loss."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)  # old keys dropped

    stage: Stage
    """queued, loading data, importing, training, ready, failed or withdrawn"""
    epoch: int | None = None
    """epochs done (null before training)"""
    epochs: int | None = None
    """epochs in all (null before training)"""
    loss: float | None = None
    """the last epoch's mean loss (null when it was not finite: JSON has no NaN)"""
    eta_seconds: float | None = None
    """seconds of training left, from the pace of the epochs done (null before the first)"""


class ModelOut(Out):
    """A model, its status and its current version."""

    id: int
    """the model's id"""
    name: str
    """display name"""
    dataset_id: int
    """the dataset it trains on"""
    status: ModelStatus
    """queued, training, ready or failed"""
    progress: Progress
    """training progress: stage, epoch, epochs"""
    error: str | None
    """why training failed"""
    architecture: Architecture
    """the architecture spec"""
    training: StoredTraining
    """the training configuration"""
    method: StoredMethod
    """the unlearning method and its options"""
    privacy: PrivacyPolicy
    """the privacy policy"""
    current_version: VersionOut | None
    """the version served now"""
    n_train: int
    """training samples it still holds"""
    created_at: datetime
    """when it was created (UTC)"""


class ModelProgress(Out):
    """One model's part of a deletion request."""

    model_id: int
    """the model"""
    status: TaskStatus
    """queued, running, done or failed"""
    version: int | None
    """the version that removed the samples"""
    certificate_id: int | None
    """its certificate"""
    n_removed: int
    """samples this model removed"""
    error: str | None
    """why it failed"""


class AlreadyErased(Out):
    """A sample erased before this request, with the certificates that removed it."""

    sample_id: str
    """the sample"""
    certificate_ids: list[int]
    """the earlier certificates"""


class DeletionOut(Out):
    """A deletion request: its status, per-model progress and certificates."""

    id: int
    """the request's id"""
    status: RequestStatus
    """queued, running, done or failed"""
    dataset_id: int
    """the dataset"""
    selector: JsonObject
    """the sample and subject ids asked for"""
    n_samples: int
    """samples matched"""
    already_erased: list[AlreadyErased]
    """samples erased earlier (no new version)"""
    models: list[ModelProgress]
    """per-model progress"""
    certificate_ids: list[int]
    """one per model that removed samples"""
    receipts: list[JsonObject] = []
    """once done, per new certificate: the signed tree head that first includes it and the
    inclusion proof at that size (keep it; check it offline with `lethe audit
    verify-receipt`)"""
    opening: str | None = None
    """only in the answer to the POST (and its idempotent replays while the request runs):
    the hex key under which each of its certificates commits to the removed ids
    (`removed_ids_commitment`, HMAC-SHA256 of the sorted ids joined by newlines). Keep it:
    the server destroys its copy once the request is finished, so nobody else can test
    candidate ids against a certificate"""
    error: str | None
    """why it failed"""
    created_at: datetime
    """when it was accepted (UTC)"""
    finished_at: datetime | None
    """when it finished"""


class AuditOut(Out):
    """A privacy audit of a model's certificates and, once done, its result."""

    id: int
    """the audit's id"""
    model_id: int
    """the model audited"""
    status: AuditStatus
    """queued, running, done or failed"""
    stage: str | None
    """while running: loading, training the shadow, removing the canaries, scoring"""
    options: JsonObject
    """canaries, kind, score, confidence, control"""
    verdict: str | None = None
    """consistent, violated (the lower bound exceeds what the certificate implies per canary),
    inconclusive (not even a perfect attack with these canaries could show a violation) or
    uncertified (a heuristic release: only the empirical figure)"""
    result: JsonObject | None
    """the audited release's certificate (guarantee, ε, δ, and the (ε', δ') it implies per
    canary), the one-run and f-DP lower bounds with the guesses that proved them, their
    ceilings with these canaries (a perfect attack), the attack's AUC, the control's bounds
    and AUC, the wall time of each step"""
    certificate_id: int | None
    """the audit's entry in the audit log"""
    error: str | None
    """why it failed"""
    created_at: datetime
    """when it was asked for (UTC)"""
    started_at: datetime | None
    """when its last attempt started"""
    finished_at: datetime | None
    """when it finished"""


class DeletionPage(Out):
    """A page of deletion requests, newest first."""

    items: list[DeletionOut]
    """the requests"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""


class KeyOut(Out):
    """An API key; its secret is shown once, when it is created."""

    id: int
    """the key's id"""
    name: str
    """its label"""
    role: str
    """its role"""
    key: str | None = None
    """the secret (only in the answer that created it)"""
    prefix: str
    """the first characters, to recognise it"""
    created_at: datetime
    """when it was created"""


# ---- open-ended documents -------------------------------------------------------------------


class Document(BaseModel):
    """A JSON document whose known keys are typed; a method's own keys are kept as they are."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Target(BaseModel):
    """A per-release (ε, δ)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    epsilon: float
    """per-release ε"""
    delta: float
    """per-release δ"""


class CertificateOut(Document):
    """A certificate as the audit API shows it: the hashed body (the keys below, and the
    method's own), its id and its entry hash."""

    id: int
    """the certificate's id"""
    seq: int
    """its position in the hash chain (1 is the first)"""
    request_id: int | None = None
    """the deletion request it answers (null for one the system made)"""
    model_id: int
    """the model"""
    from_version: int | None = None
    """the version the samples were removed from"""
    to_version: int | None = None
    """the version released without them"""
    method: str
    """the method that made the release (retrain when it fell back)"""
    guarantee: str
    """exact, rigorous, conditional or none"""
    epsilon: float | None = None
    """the release's ε (null: no claim)"""
    delta: float | None = None
    """the release's δ (null: no claim)"""
    sigma: float | None = None
    """the Gaussian noise's standard deviation"""
    sensitivity: float | None = None
    """the Δ σ was calibrated on"""
    target: Target | None = None
    """the (ε, δ) the release had to meet"""
    constants: JsonObject = {}
    """every constant, with whether it was measured or declared (restricted values only for
    auditors)"""
    fallback_reason: str | None = None
    """why the method fell back to the exact retrain"""
    removed_ids_commitment: str | None = None
    """HMAC-SHA256 of the sorted removed ids under the requester's opening"""
    prev_hash: str
    """the previous entry's hash"""
    entry_hash: str
    """sha256(prev_hash + newline + body)"""


class CertificatePage(BaseModel):
    """A page of certificates, in chain order."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    items: list[CertificateOut]
    """the certificates"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""


class LineagePreview(Document):
    """What the next release would spend of the model's lineage budget."""

    budget_epsilon: float
    """ε budget of the noisy releases since the last exact retrain"""
    budget_delta: float
    """δ budget of the same"""
    releases_since_reset: int
    """noisy releases since the last exact retrain"""
    spent_epsilon: float
    """ε spent so far"""
    epsilon_after_release: float
    """ε spent once this release is made"""
    budget_used_by_release: float
    """the ε this release adds"""
    accountant: str
    """how the lineage is composed"""


class MeasuredUpdates(BaseModel):
    """This model's own updates with the method, as measured."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    count: int
    """updates measured (the last 20 at most)"""
    median: float
    """their median compute seconds"""


class CostRow(BaseModel):
    """One method's expected cost for one single-sample deletion."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    method: str
    """the method"""
    options: JsonObject = {}
    """its options"""
    expected_compute_seconds: float | None
    """expected compute seconds (null: nothing measured to scale from)"""
    fraction_of_full_retrain: float | None
    """its share of a full retrain"""
    basis: str
    """measured or estimated, and from what"""
    measured_update_seconds: MeasuredUpdates | None = None
    """this model's measured updates with it, if any"""


class DeletionCost(BaseModel):
    """What one deletion is expected to cost under each method that could serve the model."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    full_retrain_seconds: float
    """the model's latest full training, measured"""
    methods: list[CostRow]
    """one row per method (the exact retrain first)"""


class MethodChoice(BaseModel):
    """One method for a model not yet created: whether it can serve it, what its first release
    would promise and what one deletion would cost."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    method: str
    """the method"""
    summary: str
    """what it does, in a line"""
    guarantee: str
    """exact, rigorous, conditional or none"""
    available: bool = False
    """whether POST /v1/models would accept it here with its default options"""
    refusal: str | None = None
    """why not, as the API would say it"""
    sigma: float | None = None
    """the σ of its first release at the target (null: none, or measured during the update)"""
    feasible: bool | None = None
    """whether it can meet the target (null: decided by what the update measures)"""
    reason: str = ""
    """the plan's own words"""
    fraction_of_full_retrain: float | None = None
    """one single-sample deletion's share of a full retrain (null: not known before updates)"""
    expected_compute_seconds: float | None = None
    """that share of the dataset's measured training (null: nothing measured)"""
    cost_basis: str = ""
    """where the share comes from"""
    below_floor: JsonObject | None = None
    """the utility floor's figures where every release at this target would be noise (the
    API refuses such a model: `below_utility_floor`); null: not known to fall below"""


class MethodChoices(BaseModel):
    """Every method, for a dataset, an architecture and a per-release target."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    dataset_id: int
    """the dataset"""
    architecture: str
    """the architecture type"""
    target: Target
    """the (ε, δ) planned for"""
    n_train: int
    """the dataset's active training samples"""
    full_retrain_seconds: float | None
    """a measured full training of this architecture on this dataset (null: none yet)"""
    full_retrain_basis: str
    """which"""
    methods: list[MethodChoice]
    """one row per method"""


class MlflowCopyRow(MlflowCopyOut):
    """One version's MLflow copy on the integrations page."""

    version_id: int
    """the version's id (what a retry names)"""
    model_id: int
    """its model"""
    number: int
    """its number in the model's chain"""
    next_attempt_at: datetime | None
    """when a pending copy is tried next (after its back-off)"""


class MlflowCopies(BaseModel):
    """The newest MLflow copies, and whether Lethe copies to MLflow at all."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    configured: bool
    """whether a tracking server is configured (LETHE_MLFLOW_TRACKING_URI)"""
    items: list[MlflowCopyRow]
    """newest first"""


class UtilityFloorView(BaseModel):
    """The utility floor against the next release's planned noise: every figure public."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    sigma: float
    """the planned σ"""
    noised_parameters: int
    """d, the parameters the noise is added to"""
    expected_noise_norm: float
    """σ·√d"""
    max_relative_noise: float
    """the policy's floor, a share of the scale"""
    scale: float
    """the public norm the noise is compared with"""
    scale_basis: str
    """what the scale is the norm of"""
    below: bool
    """whether the noise exceeds the floor (then the exact retrain is released)"""
    then: str
    """what the next release would be, in words"""


class PreviewOut(Document):
    """σ, feasibility and lineage cost of a model's next release, before any request (a
    method may add keys of its own)."""

    model_id: int
    """the model"""
    method: str
    """its method"""
    guarantee: str
    """exact, rigorous, conditional or none"""
    target: Target
    """the (ε, δ) previewed"""
    sigma: float | None = None
    """the noise σ the release would add (null when data-dependent)"""
    sensitivity: float | None = None
    """the Δ σ is calibrated on (null when data-dependent)"""
    noise_multiplier: float | None = None
    """σ / Δ"""
    feasible: bool | None = None
    """whether the method can meet the target (null: decided by the data)"""
    reason: str | None = None
    """why not, or what it depends on"""
    constants: JsonObject = {}
    """the plan's constants"""
    lineage: LineagePreview
    """what the release would spend of the lineage budget"""
    would_retrain_exactly: bool
    """true when the next request would fall back to the exact retrain"""
    utility_floor: UtilityFloorView | None = None
    """the policy's utility floor against the planned noise (null: no floor applies, or no
    noise-free version to scale from yet)"""
    deletion_capacity: JsonObject | None = None
    """for a method with a capacity: how many removals remain before a retrain"""
    deletion_cost: DeletionCost | None = None
    """one deletion's expected cost, per method this model could use"""
    learned_versions: int = 0
    """versions that learned appended rows; a noisy one counts in the lineage as
    any release does"""


class BadEntry(BaseModel):
    """The first certificate whose hash or fields do not hold."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    id: int
    """its id"""
    seq: int
    """its position"""
    reason: str
    """what does not hold"""


class ChainCheck(BaseModel):
    """The hash chain recomputed over every certificate."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    ok: bool
    """true when every entry holds"""
    checked: int
    """entries checked before the first bad one (or all)"""
    first_bad: BadEntry | None = None
    """the first entry that does not hold"""
    head: str | None = None
    """the last entry's hash, when all hold"""


class WebhookOut(Out):
    """A webhook endpoint; its `whsec_` secret only in the answers that made it."""

    id: int
    """the endpoint"""
    url: str
    """where events are POSTed"""
    events: list[str]
    """the event types it receives (empty: all)"""
    description: str
    """a label"""
    allow_private: bool
    """an admin allowed a loopback, link-local or private address"""
    consecutive_failures: int
    """failed attempts since the last delivered one"""
    disabled_at: datetime | None
    """when the sender disabled it after repeated failure (POST …/enable to resume)"""
    disabled_reason: str | None
    """why"""
    previous_secret_until: datetime | None = None
    """during a rotation: until when the previous secret still signs beside the new one"""
    created_at: datetime
    """when it was made"""
    secret: str | None = None
    """the signing secret (`whsec_…`, Standard Webhooks): shown once, when made or rotated"""


class DeliveryOut(Out):
    """One event's delivery to one endpoint, and its attempts so far."""

    id: int
    """the delivery"""
    message_id: str
    """the `webhook-id` (and the CloudEvent's id): the same on every attempt and replay"""
    event_type: str
    """e.g. deletion.completed"""
    status: str
    """pending, delivered or failed (given up)"""
    attempts: int
    """attempts made"""
    next_attempt_at: datetime
    """when a pending one is tried next"""
    last_status: int | None
    """the receiver's last HTTP status"""
    last_error: str | None
    """why the last attempt failed"""
    created_at: datetime
    """when the event was committed"""
    delivered_at: datetime | None
    """when a 2xx answered"""


class DeliveryPage(Out):
    """A page of an endpoint's deliveries, newest first."""

    items: list[DeliveryOut]
    """the deliveries"""
    total: int
    """how many the endpoint has"""
    offset: int
    """first item's position"""
    limit: int
    """page size"""
