"""`sharded_retrain`: exact unlearning made cheap by construction (SISA: Bourtoule et al.,
"Machine Unlearning", IEEE S&P 2021).

The model is S constituents trained on disjoint shards, each in R cumulative slices with a
checkpoint after each; a deletion retrains only the shards that held a removed sample, from
the checkpoint before the earliest slice that held one. The ensemble is then exactly what
training without those samples gives (same seeds, same assignment): ε = δ = 0.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.core.errors import unprocessable
from app.core.jsontypes import JsonMap, as_number, as_object
from app.core.specs import ArchitectureSpec, TopicHeadSpec, TopicModelSpec
from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan, exact_plan
from methods.spec import CostEntry, MemoryFacts, MethodOptions, MethodSpec, register


class ShardedOptions(MethodOptions):
    """S, R and how the constituents are aggregated (SISA §IV)."""

    shards: int = Field(4, ge=1, le=64, description="S: disjoint shards, one model each")
    slices: int = Field(
        4,
        ge=1,
        le=32,
        description="R: cumulative slices per shard, with a checkpoint after each (a "
        "deletion retrains from the checkpoint before the earliest slice it touches)",
    )
    aggregation: Literal["probabilities", "vote"] = Field(
        "probabilities",
        description="probabilities: average the constituents' softmax; vote: majority of "
        "their predictions, ties broken by the averaged probabilities",
    )


def expected_work_fraction(shards: int, slices: int) -> float:
    """Expected share of a full retrain's work that one single-sample deletion costs, for
    balanced shards and slices: 1/S of the shards, and within a shard a slice drawn
    uniformly costs Σ_{j≥r} j / Σ_j j of its stages, on average (2R + 1)/(3R)."""
    return (2 * slices + 1) / (3 * slices * shards)


def check_model(
    options: ShardedOptions, architecture: ArchitectureSpec, n_train: int, n_features: int
) -> None:
    """422 for a model that is not a network, or too few samples to give every slice one."""
    if isinstance(architecture, TopicModelSpec | TopicHeadSpec):
        raise unprocessable(
            "sharding_needs_network",
            "sharded_retrain trains S networks by SGD: use logreg, mlp or random_features",
        )
    if n_train < options.shards * options.slices:
        raise unprocessable(
            "too_few_samples_for_shards",
            f"{n_train} training samples cannot fill {options.shards} shards × "
            f"{options.slices} slices; use fewer shards or slices",
            {"n_train": n_train, "shards": options.shards, "slices": options.slices},
        )


def _plan(options: ShardedOptions, epsilon: float, delta: float) -> ReleasePlan:
    return exact_plan(
        "sharded_retrain",
        epsilon,
        delta,
        "exact: the affected shards are retrained from a checkpoint that never saw the "
        "removed samples (SISA), so ε = δ = 0; expected work per single-sample deletion "
        f"{expected_work_fraction(options.shards, options.slices):.1%} of a full retrain",
    )


ALTERNATIVES = ((4, 4), (16, 4))  # (S, R) offered, estimated, to a network not sharded


def _own_cost(options: ShardedOptions, metrics: JsonMap) -> CostEntry:
    sisa = as_object(metrics.get("sisa") or {})
    fraction = as_number(sisa.get("expected_work_fraction", 1.0))
    return CostEntry(
        {"shards": options.shards, "slices": options.slices},
        fraction,
        "measured: this model's shard and slice sizes × its training time",
    )


def _offered_to(architecture: ArchitectureSpec) -> list[CostEntry]:
    if isinstance(architecture, TopicModelSpec | TopicHeadSpec):
        return []  # not a network
    return [
        CostEntry(
            {"shards": shards, "slices": slices},
            expected_work_fraction(shards, slices),
            "estimated: balanced shards and slices; needs the model retrained sharded, and S "
            "constituents each see 1/S of the data",
        )
        for shards, slices in ALTERNATIVES
    ]


def _memory(o: ShardedOptions, f: MemoryFacts) -> dict[str, int]:
    """The other S − 1 constituents in training, and R − 1 checkpoints of each of the S."""
    per_model = f.parameters * 4
    return {"constituents": per_model * (4 * (o.shards - 1) + o.shards * (o.slices - 1))}


SPEC = register(
    MethodSpec(
        name="sharded_retrain",
        guarantee=Guarantee.exact,
        options=ShardedOptions,
        summary="exact retraining of only the affected shards from a checkpoint (SISA)",
        records_training=True,
        planner=_plan,
        check_model=check_model,
        aggregation=lambda o: o.aggregation,
        weights_metadata=lambda o: {"shards": str(o.shards), "aggregation": o.aggregation},
        own_cost=_own_cost,
        offered_to=_offered_to,
        memory_terms=_memory,
    )
)
