"""The values that cross the worker's stages: what a job loads, what an update
decides, what a commit needs. One module, imported by every stage and importing none of them,
so the pipeline, the update, the certificate and the device placement form no import circle."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from app.core.jsontypes import JsonObject
from app.core.specs import ImportedWeights, PrivacyPolicy
from app.privacy.lineage import Admission
from methods import RETRAIN
from methods.compute import ModelSpec, PrivacyTarget, Release
from workers.data import Arrays
from workers.resident import ModelSession

# ---- training ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingInputs:
    spec: ModelSpec
    data: Arrays
    test: Arrays
    imported: ImportedWeights | None
    imported_bytes: bytes | bytearray | None
    dataset_id: int = 0  # whose opened rows a resident session replaces after training
    test_left: int | None = None  # test rows gone when `test` was read (dates the split)


# ---- an update: its decision and outcome ----------------------------------------------------


@dataclass(frozen=True)
class Released:
    """The configured method's release, admitted by the lineage accountant (None: exact).

    For a method that hides its branch (`hides_branch`: it can release an exact retrain
    through its own mechanism), `branch` is None when the method's own update was
    released and, when it could not be, the reason the exact retrain was released through
    the mechanism instead. Which one ran depends on the removed rows: auditors only."""

    release: Release
    method: str
    admission: Admission | None
    hides_branch: bool = False
    branch: str | None = None


@dataclass(frozen=True)
class Fallback:
    """The configured method could not release; this is the exact retrain made instead."""

    release: Release
    requested: str
    reason: str
    method: str = RETRAIN
    admission: Admission | None = None


Decision = Released | Fallback


class Unrecoverable(RuntimeError):
    """Neither the method nor the exact retrain gave a releasable model (the retrain itself
    diverged): the job withdraws the model's weights and erases the data anyway."""


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    metrics: JsonObject


# ---- a claimed batch ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimedTask:
    task_id: int
    request_id: int
    sample_ids: list[int]
    method: str | None
    epsilon: float | None
    delta: float | None


@dataclass(frozen=True)
class Batch:
    """What committing one coalesced update needs besides its outcome."""

    model_id: int
    policy: PrivacyPolicy
    parent_id: int
    parent_number: int
    tasks: list[ClaimedTask]
    # the new version's number: past the parent's and past any number a restore found
    # published for the model (`models.version_floor`), so no number is given twice
    number: int = 0
    removed_by_task: dict[int, list[int]] = field(default_factory=dict)
    external_ids: dict[int, str] = field(default_factory=dict)
    openings: dict[int, bytes] = field(default_factory=dict)  # request id -> commitment key
    session: ModelSession | None = None  # the resident session the inputs came from
    rows_loaded: int = 0  # training rows read from the database (0: the session was warm)
    weights_metadata: dict[str, str] = field(default_factory=dict)  # the release's, but its kind
    chosen_by: str | None = None  # why the model has its method, where auto chose it
    # constant-time publication: not committed before this (the policy's
    # publish_after_seconds past the newest request's acceptance); None: at once
    publish_at: datetime | None = None

    @property
    def removed(self) -> list[int]:
        return sorted({s for ids in self.removed_by_task.values() for s in ids})

    def target(self) -> PrivacyTarget:
        """The strictest target among the policy and the coalesced requests."""
        eps = min([self.policy.epsilon, *[t.epsilon for t in self.tasks if t.epsilon]])
        dlt = min([self.policy.delta, *[t.delta for t in self.tasks if t.delta]])
        return PrivacyTarget(epsilon=eps, delta=dlt)
