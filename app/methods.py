"""The unlearning methods the service offers, as the HTTP layer needs to know them.

The maths lives in workers/methods/<name>.py; this table names each method, its guarantee
and the schema of its options, so requests are validated without importing torch.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OutputPerturbationOptions(BaseModel):
    """Seed 002 eq. (1): clip the model to norm C0, add one Gaussian draw (Δ = 2·C0), then
    optionally fine-tune on the retained data without noise (post-processing)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    C0: float = Field(1.0, gt=0.0, le=1e6)
    finetune_epochs: int = Field(0, ge=0, le=1000)
    finetune_learning_rate: float = Field(0.05, gt=0.0, le=10.0)


KNOWN_METHODS: dict[str, dict[str, Any]] = {
    "retrain": {"guarantee": "exact", "module": "workers.methods.retrain", "options": NoOptions},
    "output_perturbation": {
        "guarantee": "rigorous",
        "module": "workers.methods.output_perturbation",
        "options": OutputPerturbationOptions,
    },
}


def validate_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check a method's options against its schema; returns them with defaults filled in."""
    return KNOWN_METHODS[name]["options"].model_validate(options).model_dump()
