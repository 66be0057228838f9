"""The typed configuration of a model: architecture, training, privacy policy.

Stored as JSON on the model row; parsed back into these types wherever code reads them, so no
layer indexes an untyped dict. Pydantic only: the API, the workers and the benches share them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Strict(BaseModel):
    """No unknown keys, no NaN/∞, and no type coercion (`"20"` or `true` is not an integer),
    as the OpenAPI schema says."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True)


class LogRegSpec(Strict):
    type: Literal["logreg"]
    feature_norm: float | None = Field(
        None,
        gt=1.0,
        le=1e6,
        description="R: inputs are scaled so that ‖(x, 1)‖ ≤ R (the bias coordinate inside the "
        "bound), in training and inference alike; set by the convex_head method",
    )


class MLPSpec(Strict):
    type: Literal["mlp"]
    hidden: list[Annotated[int, Field(ge=1, le=4096)]] = Field([64, 64], min_length=1, max_length=8)
    activation: Literal["relu", "tanh", "gelu", "sigmoid"] = "relu"


ArchitectureSpec = LogRegSpec | MLPSpec
Architecture = Annotated[ArchitectureSpec, Field(discriminator="type")]
_ARCHITECTURE: TypeAdapter[ArchitectureSpec] = TypeAdapter(Architecture)


class TrainingConfig(Strict):
    epochs: int = Field(20, ge=1, le=1000)
    batch_size: int = Field(64, ge=1, le=65536)
    learning_rate: float = Field(0.1, gt=0.0, le=10.0)
    weight_decay: float = Field(1e-4, ge=0.0, le=1.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int = Field(0, ge=0, le=2**31 - 1)


class ImportedWeights(Strict):
    """Where an imported model's uploaded weights wait until its first version is written."""

    blob: str
    sha256: str


class PrivacyPolicy(Strict):
    epsilon: float = Field(1.0, gt=0.0, le=100.0, description="per-release target ε")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="per-release target δ")
    lineage_epsilon: float = Field(10.0, gt=0.0, le=1000.0)
    lineage_delta: float = Field(1e-4, gt=0.0, lt=1.0)
    allow_heuristic: bool = False


def architecture_of(spec: ArchitectureSpec | dict[str, Any]) -> ArchitectureSpec:
    """A typed architecture from its stored JSON (typed values pass through)."""
    if isinstance(spec, LogRegSpec | MLPSpec):
        return spec
    return _ARCHITECTURE.validate_python(spec)


def training_of(config: TrainingConfig | dict[str, Any]) -> TrainingConfig:
    """A typed training configuration from its stored JSON (minus the import marker)."""
    if isinstance(config, TrainingConfig):
        return config
    return TrainingConfig.model_validate({k: v for k, v in config.items() if k != "imported"})


def imported_of(config: dict[str, Any]) -> ImportedWeights | None:
    raw = config.get("imported")
    return ImportedWeights.model_validate(raw) if raw else None


def policy_of(policy: PrivacyPolicy | dict[str, Any]) -> PrivacyPolicy:
    return policy if isinstance(policy, PrivacyPolicy) else PrivacyPolicy.model_validate(policy)
