"""`"method": "auto"` at model creation: the first method of methods/auto.py's order that
serves the model, meets the policy's (ε, δ) and clears the utility floor; the model records
what was chosen and why (`method.chosen_by`), and every certificate repeats it."""

from __future__ import annotations

import math

from pydantic import ValidationError

from app.core.db.tables import Dataset
from app.core.errors import APIError, unprocessable
from app.core.schemas import ModelCreate
from methods import get_method, method_names, method_of
from methods.auto import PREFERENCE, AutoOptions, Preferred, training_work
from methods.floor import at_creation
from methods.spec import MethodChoice


def choose(spec: ModelCreate, ds: Dataset, n_train: int) -> tuple[ModelCreate, str]:
    """The model with the chosen method, and the reason, naming what was passed over."""
    options = AutoOptions.model_validate(spec.method.model_extra or {})
    body = spec.model_dump(mode="json", exclude={"method"})
    passed: list[str] = []
    for step in _candidates(spec):
        name = step.method
        try:
            candidate = ModelCreate.model_validate({**body, "method": {"name": name}})
            skip = _skip(candidate, step, ds, n_train, options)
        except ValidationError as exc:
            skip = "; ".join(str(e.get("msg", "")) for e in exc.errors())
        except APIError as exc:
            skip = exc.message
        if skip is None:
            over = f"; passed over: {'; '.join(passed)}" if passed else ""
            return candidate, f"auto: {step.why}{over}"[:2000]
        passed.append(f"{name} ({skip[:300]})")
    raise unprocessable(
        "no_method_fits", "auto found no method for this model: " + "; ".join(passed)
    )


def _candidates(spec: ModelCreate) -> list[Preferred]:
    """The one method an architecture is exclusive to (a topic model's), else the order."""
    for name in method_names():
        exclusive = get_method(name).exclusive_to
        if exclusive is not None and isinstance(spec.architecture, exclusive[0]):
            return [Preferred(name, f"the only method that trains a {spec.architecture.type}")]
    return list(PREFERENCE)


def _skip(
    candidate: ModelCreate, step: Preferred, ds: Dataset, n_train: int, options: AutoOptions
) -> str | None:
    """Why `candidate`'s method does not serve it (None: it does)."""
    choice: MethodChoice = method_of(candidate.method.model_dump())
    features = math.prod(ds.feature_shape)
    choice.check_model(candidate.architecture, n_train, features)
    policy = candidate.privacy
    plan = choice.plan(policy.epsilon, policy.delta)
    if plan.feasible is False:
        return plan.reason or "it cannot meet the policy's (ε, δ)"
    floor = at_creation(choice, candidate.architecture, features, ds.n_classes, policy)
    if floor is not None and floor.below:
        return floor.reason()
    if step.only_above_work:
        work = training_work(
            candidate.architecture, candidate.training, n_train, features, ds.n_classes
        )
        if work <= options.max_retrain_work:
            return (
                f"a full training's work ({work:.3g}) is within max_retrain_work "
                f"({options.max_retrain_work:.3g}): sharding would cost accuracy for little"
            )
    return None
