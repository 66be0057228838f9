"""Request and response models (pydantic v2). Non-finite floats are refused everywhere."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

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

from app.methods import get_method, method_names, method_of
from app.specs import (
    Architecture,
    LogRegSpec,
    PrivacyPolicy,
    TopicHeadSpec,
    TopicModelSpec,
    TrainingConfig,
)
from app.states import Guarantee


def unstorable_text(value: Any, path: str = "") -> str | None:
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


def _storable(value: Any) -> Any:
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

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _storable_text(cls, data: Any) -> Any:
        return _storable(data)


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


def _as_str(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Identifier = Annotated[str, BeforeValidator(_as_str), Field(min_length=1, max_length=200)]

# The largest id accepted: exact in every JSON client (and far below the databases' BIGINT).
MAX_ID = 2**53 - 1


# ---- datasets -------------------------------------------------------------------------------


class BuiltinDatasetIn(In):
    builtin: Literal["digits", "breast_cancer", "synthetic", "synthetic_corpus"]
    name: str | None = Field(None, max_length=200)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    n_samples: int = Field(2000, ge=10, le=200_000, description="synthetic only")
    n_features: int = Field(20, ge=1, le=4096, description="synthetic only")
    n_classes: int = Field(2, ge=2, le=100, description="synthetic only")
    vocabulary: int = Field(2000, ge=3, le=20_000, description="synthetic_corpus only")
    topics: int = Field(20, ge=2, le=500, description="synthetic_corpus only")
    document_length: int = Field(100, ge=2, le=10_000, description="synthetic_corpus only")
    separability: float = Field(
        0.05, gt=0.0, le=1.0, description="synthetic_corpus only: anchor-word mass p"
    )


class DatasetOut(Out):
    id: int
    name: str
    kind: str
    source: str
    feature_shape: list[int]
    n_classes: int
    n_samples: int
    counts: dict[str, int] = {}
    text: dict[str, Any] | None = None
    created_at: datetime


class SampleOut(Out):
    """A sample as readers see it; once erased its ids and label are gone (null)."""

    external_id: str | None
    subject_id: str | None
    split: str
    label: int | None
    status: str
    erased_at: datetime | None


class SamplePage(BaseModel):
    items: list[SampleOut]
    total: int
    offset: int
    limit: int


# ---- models ---------------------------------------------------------------------------------


NONDETERMINISTIC_LAYERS = {"dropout", "batchnorm", "batch_norm", "augmentation"}


def _method_variants(schema: dict[str, Any]) -> None:
    """In OpenAPI, one variant per method: its `name` and exactly its options (`name` may
    be left out for the default, retrain)."""
    variants = []
    for name in method_names():
        options = get_method(name).options.model_json_schema()
        variant: dict[str, Any] = {
            "type": "object",
            "title": name,
            "properties": {"name": {"const": name}, **options.get("properties", {})},
            "additionalProperties": False,
        }
        if name != "retrain":
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
    name: str = "retrain"

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in method_names():
            raise ValueError(f"unknown method {value!r}; available: {method_names()}")
        return value

    @model_validator(mode="after")
    def _options(self) -> MethodConfig:
        options = method_of({"name": self.name, **(self.model_extra or {})}).options
        for key, value in options.model_dump().items():
            setattr(self, key, value)
        return self


class ModelCreate(In):
    name: str = Field(..., min_length=1, max_length=200)
    dataset_id: int = Field(ge=1, le=MAX_ID)
    architecture: Architecture = Field(default_factory=lambda: LogRegSpec(type="logreg"))
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    privacy: PrivacyPolicy = Field(default_factory=PrivacyPolicy)

    @model_validator(mode="before")
    @classmethod
    def _deterministic_layers_only(cls, data: Any) -> Any:
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
    def _topic_models_learn_by_anchor_words(self) -> ModelCreate:
        """A topic model is trained and unlearned by `anchor_topics` only (it is not a
        network the other methods could train)."""
        if isinstance(self.architecture, TopicHeadSpec) and self.method.name != "topic_head":
            raise PydanticCustomError(
                "topic_head_needs_topic_head_method",
                "a topic_head is trained and unlearned by the topic_head method",
            )
        if isinstance(self.architecture, TopicModelSpec) and self.method.name != "anchor_topics":
            raise PydanticCustomError(
                "topic_model_needs_anchor_topics",
                "a topic_model is learned by the anchor-word algorithm: use the "
                "anchor_topics method (a request may still ask for an exact retrain)",
            )
        return self

    @model_validator(mode="after")
    def _heuristic_only_when_allowed(self) -> ModelCreate:
        """A method without a guarantee runs only where the policy says so (it is never a
        fallback either: Lethe falls back to exact retraining)."""
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
    def _convex_head_clips_inputs(self) -> ModelCreate:
        """convex_head certifies a logistic head on inputs with ‖(x, 1)‖ ≤ R: the model's
        network clips them, in training and inference alike."""
        if self.method.name != "convex_head":
            return self
        R = method_of(self.method.model_dump()).options.R
        if not isinstance(self.architecture, LogRegSpec):
            raise PydanticCustomError(
                "convex_head_needs_logreg", "convex_head trains a logistic head: use logreg"
            )
        if self.architecture.feature_norm not in (None, R):
            raise PydanticCustomError(
                "feature_norm_mismatch",
                "architecture.feature_norm ({given}) must equal the method's R ({R})",
                {"given": self.architecture.feature_norm, "R": R},
            )
        self.architecture = self.architecture.model_copy(update={"feature_norm": R})
        return self


class VersionOut(Out):
    number: int
    parent: int | None
    kind: str
    weights_sha256: str
    weights_size: int
    weights_available: bool
    metrics: dict[str, Any]
    n_train: int
    created_at: datetime
    erased_at: datetime | None


class ModelOut(Out):
    id: int
    name: str
    dataset_id: int
    status: str
    progress: dict[str, Any]
    error: str | None
    architecture: dict[str, Any]
    training: dict[str, Any]
    method: dict[str, Any]
    privacy: dict[str, Any]
    current_version: VersionOut | None
    n_train: int
    created_at: datetime


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
    sample_ids: list[Identifier] = Field(default_factory=list, max_length=100_000)
    subject_ids: list[Identifier] = Field(default_factory=list, max_length=100_000)
    method: str | None = Field(None, json_schema_extra={"enum": [*method_names(), None]})
    epsilon: float | None = Field(None, gt=0.0)
    delta: float | None = Field(None, gt=0.0, lt=1.0)


class ModelProgress(BaseModel):
    model_id: int
    status: str
    version: int | None
    certificate_id: int | None
    n_removed: int
    error: str | None


class AlreadyErased(BaseModel):
    sample_id: str
    certificate_ids: list[int]


class DeletionOut(BaseModel):
    id: int
    status: str
    dataset_id: int
    selector: dict[str, Any]
    n_samples: int
    already_erased: list[AlreadyErased]
    models: list[ModelProgress]
    certificate_ids: list[int]
    error: str | None
    created_at: datetime
    finished_at: datetime | None


class DeletionPage(BaseModel):
    """A page of deletion requests, newest first."""

    items: list[DeletionOut]
    offset: int
    limit: int


# ---- keys -----------------------------------------------------------------------------------


class KeyCreate(In):
    role: Literal["admin", "requester", "auditor", "reader"]
    name: str = Field("api key", min_length=1, max_length=200)


class KeyOut(BaseModel):
    id: int
    name: str
    role: str
    key: str | None = None
    prefix: str
    created_at: datetime
