"""The torch-free half of a method: its options, its guarantee, what it needs, its plan.

The compute half lives beside it, in methods/<name>/compute.py; `tests/integration/test_registry.py`
fails if either half is missing. Modelled on Opacus' accountant registry: a plug-in by name;
the compute half is imported by its folder's name only when a worker needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from app.core.jsontypes import JsonMap, JsonObject
from app.core.specs import ArchitectureSpec, StoredMethod
from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan, data_dependent_plan

# the exact retrain: a method of its own, and every other method's fallback
RETRAIN = "retrain"


class MethodOptions(BaseModel):
    """Base of every method's options: unknown keys, non-finite numbers and values of the
    wrong JSON type (no coercion) are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, strict=True)
    evaluate: bool = Field(
        False,
        description="evaluate each update against a retrained reference (costs one retrain "
        "per update): accuracies, membership-inference AUC, distances",
    )


OptionsT = TypeVar("OptionsT", bound=MethodOptions)
Planner = Callable[[OptionsT, float, float], ReleasePlan]
# Plans the next release from what the current version recorded (`plan_inputs` in its
# metrics), for a method whose σ depends on the model's history (the topic models' m_U).
RecordedPlanner = Callable[[OptionsT, JsonMap, float, float], ReleasePlan]
# Refuses (raises an APIError) a model the method cannot serve: options, architecture,
# number of training samples, number of input features.
ModelCheck = Callable[[OptionsT, ArchitectureSpec, int, int], None]
# The architecture as the method needs it (e.g. inputs clipped), or a PydanticCustomError.
ArchitectureFit = Callable[[OptionsT, ArchitectureSpec], ArchitectureSpec]


@dataclass(frozen=True)
class PreviewFacts:
    """What the preview knows of a model, for a method's own part of it (`preview_extras`)."""

    sigma: float
    n_features: int
    n_classes: int
    version_metrics: JsonMap
    recent: list[dict[str, Any]]  # the last certificates, oldest first (disclosed if allowed)
    disclose: bool  # the caller may see values that are functions of removed data


@dataclass(frozen=True)
class MemoryFacts:
    """What a method's `memory_terms` hook knows of the model it would serve."""

    architecture: ArchitectureSpec
    n_train: int
    n_features: int
    n_classes: int
    parameters: int  # of one network (trained and frozen)
    feature_width: int  # inputs of the trained last layer, bias included


@dataclass(frozen=True)
class CostEntry:
    """One line of the deletion-cost table: a method with options, its share of a full
    retrain for one single-sample deletion, and where that share comes from."""

    options: JsonObject
    fraction: float
    basis: str


@dataclass(frozen=True)
class MethodSpec(Generic[OptionsT]):
    """What the HTTP layer and the preview know about a method (DESIGN §7)."""

    name: str
    guarantee: Guarantee
    options: type[OptionsT]
    summary: str
    records_training: bool = False  # training must run inside Lethe (it records or constrains)
    uses_statistics: bool = False  # the update reads the removed samples' stored statistics
    planner: Planner[OptionsT] | None = None  # σ and Δ before any request, when they are data-free
    next_release: RecordedPlanner[OptionsT] | None = (
        None  # the same, from the current version's record
    )
    check_model: ModelCheck[OptionsT] | None = None  # at model creation, before anything is written
    # Hooks through which the generic code reaches what is the method's own:
    fit_architecture: ArchitectureFit[OptionsT] | None = None  # at model creation
    # the architecture type only this method may train, and the error (code, message) else
    exclusive_to: tuple[type, str, str] | None = None
    aggregation: Callable[[OptionsT], str] | None = None  # how an ensemble's members vote
    weights_metadata: Callable[[OptionsT], dict[str, str]] | None = None  # for the loader
    preview_extras: Callable[[OptionsT, PreviewFacts], JsonObject] | None = None
    # this model's own share of a full retrain per deletion, from its version metrics
    own_cost: Callable[[OptionsT, JsonMap], CostEntry] | None = None
    # the method offered, estimated, to a model of another method with this architecture
    offered_to: Callable[[ArchitectureSpec], list[CostEntry]] | None = None
    # a data-free bound on the noise-free model's norm (options, architecture, features,
    # classes): the utility floor checks a policy against it at creation (methods/floor.py)
    norm_bound: Callable[[OptionsT, ArchitectureSpec, int, int], float | None] | None = None
    # bytes the method holds beyond one network's training (app/core/services/memory.py)
    memory_terms: Callable[[OptionsT, MemoryFacts], dict[str, int]] | None = None
    # the training record the method keeps with a version (what its update reads back)
    record: type[BaseModel] | None = None
    # OpenAPI examples: a model body for POST /v1/models ("model"), a form for the import
    # route ("import"), each {"summary": ..., "value": ...}
    examples: dict[str, JsonObject] = field(default_factory=dict)

    def parse(self, raw: JsonMap) -> OptionsT:
        """The options from a model's stored `method` JSON (its `name`, and `chosen_by` where
        `auto` chose it, are not options)."""
        return self.options.model_validate(
            {k: v for k, v in raw.items() if k not in ("name", "chosen_by")}
        )

    def plan(self, options: OptionsT, epsilon: float, delta: float) -> ReleasePlan:
        """σ, Δ and the lineage event of the next release at (ε, δ), or, for a method whose
        Δ is measured during the update, a plan that says so."""
        if self.planner is not None:
            return self.planner(options, epsilon, delta)
        return data_dependent_plan(self.name, self.guarantee, epsilon, delta)


_REGISTRY: dict[str, MethodSpec[Any]] = {}


def register(spec: MethodSpec[OptionsT]) -> MethodSpec[OptionsT]:
    if spec.name in _REGISTRY:
        raise ValueError(f"method {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def method_names() -> list[str]:
    return sorted(_REGISTRY)


def get_method(name: str) -> MethodSpec[Any]:
    """The spec registered under `name` (KeyError names the known methods)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; available: {method_names()}") from None


@dataclass(frozen=True)
class MethodChoice:
    """A model's method: its spec and its validated options."""

    spec: MethodSpec[Any]
    options: Any

    @property
    def name(self) -> str:
        return self.spec.name

    def plan(self, epsilon: float, delta: float) -> ReleasePlan:
        return self.spec.plan(self.options, epsilon, delta)

    def plan_next(self, epsilon: float, delta: float, recorded: JsonMap | None) -> ReleasePlan:
        """The next release's plan: from the current version's record when the method plans
        from one and the version has it, else the data-free plan."""
        if self.spec.next_release is not None and recorded:
            self.spec.plan(self.options, epsilon, delta)  # validates (ε, δ) the same way
            return self.spec.next_release(self.options, recorded, epsilon, delta)
        return self.plan(epsilon, delta)

    def check_model(self, architecture: ArchitectureSpec, n_train: int, n_features: int) -> None:
        """Raise the method's 422 if it cannot serve such a model."""
        if self.spec.check_model is not None:
            self.spec.check_model(self.options, architecture, n_train, n_features)

    @property
    def aggregation(self) -> str:
        """How an ensemble's members vote ("probabilities" for a single model)."""
        hook = self.spec.aggregation
        return hook(self.options) if hook is not None else "probabilities"

    def weights_metadata(self) -> dict[str, str]:
        """What the loader needs of this method beyond the architecture (e.g. SISA's S)."""
        hook = self.spec.weights_metadata
        return hook(self.options) if hook is not None else {}

    def to_json(self) -> JsonObject:
        return {"name": self.name, **self.options.model_dump()}


def method_of(raw: JsonMap | StoredMethod) -> MethodChoice:
    """Parse a stored or requested `{"name": ..., **options}` into a typed choice."""
    if isinstance(raw, StoredMethod):
        raw = raw.model_dump(mode="json")
    spec = get_method(str(raw.get("name", RETRAIN)))
    return MethodChoice(spec, spec.parse(raw))
