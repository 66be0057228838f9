"""The one interface every unlearning method implements (DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

GuaranteeKind = Literal["exact", "rigorous", "conditional", "none"]
ModelState = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelSpec:
    """What a method needs to know about the model it serves."""

    architecture: dict[str, Any]
    training: dict[str, Any]
    method: dict[str, Any]
    n_features: int
    n_classes: int
    record: dict[str, Any] | None = None  # what training recorded for the statistics in use


@dataclass(frozen=True)
class PrivacyTarget:
    epsilon: float
    delta: float


@dataclass
class RemovedSamples:
    sample_ids: list[int]
    X: torch.Tensor
    y: torch.Tensor
    statistics: dict[int, torch.Tensor] = field(default_factory=dict)  # sample id -> vector
    previously_removed: list[int] = field(default_factory=list)  # since the record was made


@dataclass
class RetainedData:
    sample_ids: list[int]
    X: torch.Tensor
    y: torch.Tensor
    subjects: list[str | None] = field(default_factory=list)


@dataclass
class StatisticsBlock:
    """Per-sample (or per-subject) vectors to store; row i belongs to `sample_ids[i]`."""

    kind: str
    sample_ids: list[int]
    kinds: list[str]
    vectors: torch.Tensor
    dtype: str = "float32"


@dataclass
class Trained:
    """What a method's own training produced (methods that record during training)."""

    state: dict[str, torch.Tensor]
    statistics: StatisticsBlock | None
    record: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Constant:
    """A number a certificate relies on, and whether it was measured or declared."""

    value: float
    source: Literal["measured", "declared"]
    meaning: str


class TargetInfeasible(RuntimeError):
    """The method cannot meet the target; the pipeline retrains exactly instead."""


@dataclass
class CertificateFields:
    guarantee: GuaranteeKind
    epsilon: float
    delta: float
    sigma: float
    sensitivity: float
    accountant: str
    sentence: str
    constants: dict[str, Constant] = field(default_factory=dict)
    compares: str = "the released model vs. retraining without the removed samples"
    resets_lineage: bool = False
    fallback_reason: str | None = None
    lineage_event: dict[str, Any] | None = None  # default: a Gaussian event from σ and Δ


@dataclass
class Update:
    next_state: ModelState  # noise-free; starts the next update; never downloadable
    release: ModelState  # what users download
    certificate: CertificateFields
    statistics_to_delete: list[int]  # sample ids whose per-sample rows this update consumed
    version_kind: Literal["unlearned", "retrained"] = "unlearned"
    metrics: dict[str, Any] = field(default_factory=dict)
    lineage: Any = None  # app.privacy.lineage.LineageSpend, set by the job before commit
    replace_statistics: StatisticsBlock | None = None  # a retrain re-records everything
    record: dict[str, Any] | None = None  # the new training record, if statistics changed


class UnlearningMethod(Protocol):
    name: str
    guarantee: GuaranteeKind
    needs_retained_data: bool

    def unlearn(
        self,
        state: ModelState,
        removed: RemovedSamples,
        target: PrivacyTarget,
        data: RetainedData | None,
    ) -> Update: ...
