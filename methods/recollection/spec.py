"""`recollection` (seed 003): training records one vector per sample; a deletion adds them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.states import Guarantee
from methods.spec import MemoryFacts, MethodOptions, MethodSpec, register


class RecollectionOptions(MethodOptions):
    """Seed 003: training records one recollection vector per sample; a deletion adds them."""

    C: float = Field(10.0, gt=0.0, le=1e6, description="batch-gradient clipping norm")
    q: float = Field(0.995, gt=0.0, le=1.0, description="per-step learning-rate decay")
    storage_dtype: Literal["float32", "float16"] = "float32"
    per_subject: bool = Field(False, description="one summed vector per data subject")
    rho_checks: int = Field(10, ge=1, le=1000, description="steps where ρ is measured")
    power_iterations: int = Field(20, ge=5, le=500)
    max_sigma: float | None = Field(None, gt=0.0, description="retrain exactly above this σ")
    max_relative_noise: float | None = Field(
        1.0,
        gt=0.0,
        description="retrain exactly when the noise norm σ√d exceeds this multiple "
        "of the trained weights' norm (the release would be useless); null disables the guard",
    )


class RecollectionRecord(BaseModel):
    """What training recorded beside the vectors (seed 003 Stage I): enough to replay the
    batch schedule and bound Theorem 2 for any later removal."""

    model_config = ConfigDict(frozen=True)

    method: Literal["recollection"] = "recollection"
    train_sample_ids: list[int]  # training order, the schedule's indices
    rho: float  # the largest measured batch-Hessian norm (ρ)
    rho_trace: list[tuple[int, float]]  # (step, ρ) where it was measured
    C: float
    q: float
    eta: float
    epochs: int
    batch_size: int
    seed: int
    weight_decay: float
    steps: int
    clipped_steps: int
    precompute_seconds: float
    d: int
    storage_dtype: str
    rows: int
    subject_groups: dict[str, list[int]] = {}  # representative id -> the subject's samples
    # ‖w‖ of the model as trained, published with it: the public reference of the noise
    # guard; None in records made before it was kept
    trained_norm: float | None = None


def _memory(o: RecollectionOptions, f: MemoryFacts) -> dict[str, int]:
    """One recorded vector per sample (float32 at most)."""
    return {"statistics": f.n_train * f.parameters * 4}


SPEC = register(
    MethodSpec(
        name="recollection",
        guarantee=Guarantee.conditional,
        options=RecollectionOptions,
        summary="add the removed samples' recollection vectors, then Gaussian noise (Theorem 2)",
        records_training=True,
        uses_statistics=True,
        memory_terms=_memory,
        record=RecollectionRecord,
    )
)
