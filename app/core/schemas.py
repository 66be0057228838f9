"""Request and response models (pydantic v2). Non-finite floats are refused everywhere."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.core.identity import DatasetIds
from app.core.jsontypes import JsonObject, JsonValue
from app.core.specs import (
    Architecture,
    LogRegSpec,
    PrivacyPolicy,
    TrainingConfig,
)
from app.core.states import Guarantee
from app.core.wire import (  # noqa: F401 - the response models, re-exported
    AlreadyErased,
    AppendOut,
    AppendPage,
    DatasetOut,
    DatasetPage,
    DatasetSummary,
    DeletionOut,
    DeletionPage,
    KeyOut,
    Learning,
    ModelOut,
    ModelProgress,
    Out,
    SampleOut,
    SamplePage,
    VersionOut,
)
from methods import RETRAIN, get_method, method_names, method_of
from methods.auto import AUTO, AutoOptions


def unstorable_text(value: object, path: str = "") -> str | None:
    """Where in `value` (nested dicts, lists; keys too) a string is not storable text: not
    encodable as UTF-8 (a lone surrogate, sent as a JSON escape like "\\ud800") or holding
    a NUL character (PostgreSQL text cannot). None when every string is fine."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(value)"
        if "\x00" in value:
            return path or "(value)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if (bad := unstorable_text(key, where)) or (bad := unstorable_text(item, where)):
                return bad
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if bad := unstorable_text(item, f"{path}[{i}]"):
                return bad
    return None


def _storable(value: object) -> object:
    if (where := unstorable_text(value)) is not None:
        raise PydanticCustomError(
            "invalid_text",
            "text must be valid Unicode without NUL characters (no lone surrogates such as "
            "\\ud800); {where} is not",
            {"where": where.encode("utf-8", "backslashreplace").decode("utf-8")},
        )
    return value


# A string a client sends outside a JSON body (a query parameter): storable text only.
Text = Annotated[str, AfterValidator(_storable)]


class In(BaseModel):
    """A request body: no unknown keys, no NaN/∞, no type coercion (`"1"` or `true` is not
    an integer, as the OpenAPI schema says). Every string in it, dictionary keys and nested
    values included, must be storable text (`unstorable_text`), checked once on the raw
    input."""

    model_config = ConfigDict(
        extra="forbid", allow_inf_nan=False, strict=True, use_attribute_docstrings=True
    )

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: object) -> object:
        return _storable(data)


def _as_str(value: object) -> object:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Identifier = Annotated[str, BeforeValidator(_as_str), Field(min_length=1, max_length=200)]

# The largest id accepted: exact in every JSON client (and far below the databases' BIGINT).
MAX_ID = 2**53 - 1


# ---- datasets -------------------------------------------------------------------------------


class S3Location(In):
    """An object in the bucket store Lethe is configured for (its endpoint and keys)."""

    bucket: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.\-]*[a-z0-9]$")
    """the bucket"""
    key: str = Field(min_length=1, max_length=1024)
    """the object's key"""


class ObjectSource(In):
    """Where the rows are: an object in S3-compatible storage."""

    s3: S3Location
    """the object"""


class IdRulesIn(In):
    """How a new dataset reads its ids (docs/concepts/ids.md): every id is trimmed, NFKC
    normalised and stripped of invisible characters; these say more."""

    id_case: Literal["sensitive", "insensitive"] = "sensitive"
    """`insensitive`: ids and subjects that differ only in case are one (kept case-folded)"""
    numeric_ids: list[Literal["sample", "subject"]] = Field([], max_length=2)
    """which ids are numbers: `007`, `7.0` and `7` are then one id"""

    def rules(self) -> DatasetIds:
        return DatasetIds(self.id_case, frozenset(self.numeric_ids))


class ObjectDatasetIn(IdRulesIn):
    """A dataset read from object storage by the registration's worker, with the column
    mapping of a CSV or Parquet upload."""

    source: ObjectSource
    """where the rows are"""
    format: Literal["parquet", "csv", "npz"] | None = None
    """parquet, csv or npz (default: from the key's suffix; app/core/formats)"""
    name: str | None = Field(None, max_length=200)
    """a display name (default: the key)"""
    label_column: str = Field("label", min_length=1, max_length=200)
    """the label column (csv, parquet)"""
    id_column: str | None = Field(None, min_length=1, max_length=200)
    """the sample id column"""
    subject_column: str | None = Field(None, min_length=1, max_length=200)
    """the data subject column"""
    split_column: str | None = Field(None, min_length=1, max_length=200)
    """a train/test column (default: a seeded stratified split)"""
    feature_columns: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        [], max_length=65_536
    )
    """the feature columns (default: every other numeric column, or Parquet's one list column)"""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """seeds the split"""
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """share of samples put in the test split"""
    on_erased: Literal["refuse", "skip"] = "refuse"
    """rows of samples or people erased earlier: refuse (409), or leave them out"""


class BuiltinDatasetIn(IdRulesIn):
    """A builtin dataset, built on the server: scikit-learn's digits or breast cancer, a seeded
    Gaussian mixture, or a synthetic text corpus."""

    builtin: Literal["digits", "breast_cancer", "synthetic", "synthetic_corpus"]
    """which builtin"""
    name: str | None = Field(None, max_length=200)
    """a display name (default: the builtin's)"""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """seeds the split and the synthetic draws"""
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """share of samples put in the test split"""
    on_erased: Literal["refuse", "skip"] = "refuse"
    """rows of samples or people erased earlier: refuse the registration (409), or leave
    them out (counted in `skipped_erased`)"""
    n_samples: int = Field(
        2000,
        ge=10,
        le=10_000_000,
        description="synthetic only (the server's LETHE_MAX_DATASET_SAMPLES and "
        "LETHE_MAX_DATASET_CELLS bound it too)",
    )
    n_features: int = Field(20, ge=1, le=4096, description="synthetic only")
    n_classes: int = Field(2, ge=2, le=100, description="synthetic only")
    subject_size: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="synthetic only: consecutive rows share a data subject, "
        "`subject-<row // subject_size>` (default: no subjects)",
    )
    vocabulary: int = Field(2000, ge=3, le=20_000, description="synthetic_corpus only")
    topics: int = Field(20, ge=2, le=500, description="synthetic_corpus only")
    document_length: int = Field(100, ge=2, le=10_000, description="synthetic_corpus only")
    separability: float = Field(
        0.05, gt=0.0, le=1.0, description="synthetic_corpus only: anchor-word mass p"
    )


# ---- models ---------------------------------------------------------------------------------


NONDETERMINISTIC_LAYERS = {"dropout", "batchnorm", "batch_norm", "augmentation"}


def _method_variants(schema: JsonObject) -> None:
    """In OpenAPI, one variant per method: its `name` and exactly its options (`name` may
    be left out for the default, retrain)."""
    variants: list[JsonValue] = []
    for name in [AUTO, *method_names()]:
        chooser = AutoOptions if name == AUTO else get_method(name).options
        options = chooser.model_json_schema()
        variant: JsonObject = {
            "type": "object",
            "title": name,
            "properties": {"name": {"const": name}, **options.get("properties", {})},
            "additionalProperties": False,
        }
        if name != RETRAIN:
            variant["required"] = ["name"]
        variants.append(variant)
    description = schema.get("description", "")
    schema.clear()
    schema.update({"title": "MethodConfig", "description": description, "oneOf": variants})


class MethodConfig(BaseModel):
    """The unlearning method and its own options (each method validates the rest)."""

    model_config = ConfigDict(
        extra="allow", allow_inf_nan=False, strict=True, json_schema_extra=_method_variants
    )
    name: str = RETRAIN

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value != AUTO and value not in method_names():
            raise ValueError(f"unknown method {value!r}; available: {[AUTO, *method_names()]}")
        return value

    @property
    def auto(self) -> bool:
        """Lethe chooses the method at creation (methods/auto.py)."""
        return self.name == AUTO

    @model_validator(mode="after")
    def _options(self) -> MethodConfig:
        extra = self.model_extra or {}
        if "chosen_by" in extra:
            raise ValueError("chosen_by is Lethe's to set, where it chose the method (auto)")
        if self.auto:
            options: BaseModel = AutoOptions.model_validate(extra)
        else:
            options = method_of({"name": self.name, **extra}).options
        for key, value in options.model_dump().items():
            setattr(self, key, value)
        return self


class ModelCreate(In):
    """A model to train on a dataset: its architecture, training, unlearning method and privacy
    policy."""

    name: str = Field(..., min_length=1, max_length=200)
    """display name"""
    dataset_id: int = Field(ge=1, le=MAX_ID)
    """the dataset to train on (its active training samples)"""
    architecture: Architecture = Field(default_factory=lambda: LogRegSpec(type="logreg"))
    """the network, built from this spec (never from code)"""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """the training configuration"""
    method: MethodConfig = Field(default_factory=MethodConfig)
    """the unlearning method and its options"""
    privacy: PrivacyPolicy = Field(default_factory=PrivacyPolicy)
    """the per-release target and the lineage budget"""

    @model_validator(mode="before")
    @classmethod
    def _deterministic_layers_only(cls, data: object) -> object:
        """Lethe builds deterministic layers only: methods replay or linearise the training
        trajectory, and dropout or batch statistics would make it irreproducible."""
        arch = data.get("architecture") if isinstance(data, dict) else None
        if isinstance(arch, dict):
            asked = sorted(NONDETERMINISTIC_LAYERS & set(arch))
            if asked:
                raise PydanticCustomError(
                    "nondeterministic_architecture",
                    "Lethe builds deterministic layers only; {layers} would make the training "
                    "trajectory non-deterministic (recollection could not replay it)",
                    {"layers": ", ".join(asked)},
                )
        return data

    @model_validator(mode="after")
    def _architecture_has_its_method(self) -> ModelCreate:
        """An architecture that one method alone can train (a topic model, a topic head)
        names that method (its spec's `exclusive_to`)."""
        for name in method_names():
            exclusive = get_method(name).exclusive_to
            if exclusive is None or name == self.method.name or self.method.auto:
                continue
            kind, code, message = exclusive
            if isinstance(self.architecture, kind):
                raise PydanticCustomError(code, message)
        return self

    @model_validator(mode="after")
    def _heuristic_only_when_allowed(self) -> ModelCreate:
        """A method without a guarantee runs only where the policy says so (it is never a
        fallback either: Lethe falls back to exact retraining)."""
        if self.method.auto:
            return self  # auto never chooses a heuristic
        if get_method(self.method.name).guarantee == Guarantee.none and not (
            self.privacy.allow_heuristic
        ):
            raise PydanticCustomError(
                "heuristic_not_allowed",
                "{method} is a heuristic: it makes no privacy or exactness claim, so it runs "
                "only when the model's privacy policy sets allow_heuristic: true",
                {"method": self.method.name},
            )
        return self

    @model_validator(mode="after")
    def _architecture_as_the_method_needs_it(self) -> ModelCreate:
        """The method's `fit_architecture` hook (convex_head clips inputs to ‖(x, 1)‖ ≤ R)."""
        if self.method.auto:
            return self  # applied to the method auto chooses
        choice = method_of(self.method.model_dump())
        if choice.spec.fit_architecture is not None:
            self.architecture = choice.spec.fit_architecture(choice.options, self.architecture)
        return self


# ---- deletions ------------------------------------------------------------------------------


class DeletionCreate(In):
    """Give sample ids, subject ids, or both (at least one id)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["sample_ids"], "properties": {"sample_ids": {"minItems": 1}}},
                {"required": ["subject_ids"], "properties": {"subject_ids": {"minItems": 1}}},
            ]
        }
    )
    dataset_id: int = Field(ge=1, le=MAX_ID)
    """the dataset the samples belong to"""
    sample_ids: list[Identifier] = Field(default_factory=list, max_length=100_000)
    """the clients' sample ids to forget"""
    subject_ids: list[Identifier] = Field(default_factory=list, max_length=100_000)
    """data subjects whose samples to forget"""
    method: str | None = Field(None, json_schema_extra={"enum": [*method_names(), None]})
    """force a method for this request (`retrain` or the model's own)"""
    epsilon: float | None = Field(None, gt=0.0)
    """a tighter per-release ε than the models' policies"""
    delta: float | None = Field(None, gt=0.0, lt=1.0)
    """a tighter per-release δ than the models' policies"""


# ---- keys -----------------------------------------------------------------------------------


class KeyCreate(In):
    """A new API key."""

    role: Literal["admin", "requester", "auditor", "reader"]
    """admin, requester (asks for deletions), auditor (reads certificates and the log) or reader
    (reads models, downloads weights)"""
    name: str = Field("api key", min_length=1, max_length=200)
    """a label for the key"""


class AuditCreate(In):
    """An empirical privacy audit of a model's certificates with canaries."""

    canaries: int = Field(1000, ge=20, le=10_000, description="m, the number of canaries")
    kind: Literal["random", "mislabelled", "leverage"] = Field(
        "random",
        description="random: inputs drawn like the data's features with random labels; "
        "mislabelled: test-split rows with a wrong label (training rows beyond the test "
        "split's size); leverage (logreg only): inputs along the data's least-varied "
        "directions, where a linear model's removal leaves most behind",
    )
    score: Literal["loss", "margin", "weights"] = Field(
        "loss",
        description="what the attack ranks canaries by: −loss, the logit margin, or weights "
        "(white-box: the release's offset from a reference trained without canaries along "
        "each canary's gradient, the likelihood ratio of Gaussian noise; one network only)",
    )
    confidence: float = Field(0.95, ge=0.5, le=0.999, description="of the lower bounds")
    control: bool = Field(
        True, description="also bound the shadow before the removal (canaries never unlearned)"
    )
    sequence: int = Field(
        1,
        ge=1,
        le=10,
        description="a lineage audit: the canaries' removal, then this many − 1 deletions of "
        "single rows, the whole sequence tested against its releases' composed (ε, δ)",
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=2**63 - 1,
        description="draw the canaries and their bits from this seed, to repeat an audit "
        "exactly (default: fresh randomness)",
    )


class WebhookCreate(In):
    """A receiver of Lethe's events: Standard Webhooks signatures, CloudEvents
    bodies."""

    url: str = Field(min_length=8, max_length=2000, description="http:// or https:// URL")
    events: list[str] = Field(
        default_factory=list,
        max_length=20,
        description="event types to receive (empty: all): deletion.completed, "
        "version.published, audit.completed, dataset.ready, model.withdrawn",
    )
    description: str = Field("", max_length=200, description="a label")
    allow_private: bool = Field(
        False,
        description="allow a URL that resolves to a loopback, link-local or private address "
        "(refused otherwise: server-side request forgery)",
    )
