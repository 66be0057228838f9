"""`"method": "auto"`: Lethe chooses a model's method at creation, the first of a fixed order
that can serve the model, meets the policy's (ε, δ) and clears the utility floor
(docs/concepts/methods.md, "Choosing a method"). Methods whose certificate rests on constants
Lethe cannot check (conditional), heuristics, and methods whose noise is calibrated on the whole
model (output_perturbation, noisy_finetune) are never chosen for the user: they are chosen by
name."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from app.core.specs import ArchitectureSpec, TrainingConfig
from architectures import kind_of
from methods.spec import RETRAIN

AUTO = "auto"


class AutoOptions(BaseModel):
    """What `auto` weighs besides the model."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_retrain_work: float = Field(
        1e12,
        gt=0.0,
        le=1e21,
        description="a network whose full training does more than this much work (epochs × "
        "training rows × parameters) is sharded (sharded_retrain) rather than retrained whole",
    )


@dataclass(frozen=True)
class Preferred:
    """One step of auto's order: the method, why it is preferred, and whether it is chosen
    only for a model whose full training exceeds `max_retrain_work` (it changes the model:
    SISA's constituents each see 1/S of the rows)."""

    method: str
    why: str
    only_above_work: bool = False


# cheapest per deletion first; the exact retrain, last, always serves
PREFERENCE: tuple[Preferred, ...] = (
    Preferred("minnorm", "exact, and a deletion is a projection with no retraining"),
    Preferred(
        "convex_head", "a Newton step certified by a measured shift, a small share of a retrain"
    ),
    Preferred(
        "sharded_retrain",
        "exact, and a deletion retrains one shard from a checkpoint",
        only_above_work=True,
    ),
    Preferred(RETRAIN, "exact, and a full retrain of this model is small"),
)


def training_work(
    architecture: ArchitectureSpec,
    training: TrainingConfig,
    n_train: int,
    n_features: int,
    n_classes: int,
) -> float:
    """epochs × rows × parameters: a full training's work, from public values only."""
    parameters = kind_of(architecture).parameters(architecture, n_features, n_classes)
    return float(training.epochs) * n_train * parameters
