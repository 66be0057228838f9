"""Choosing a method for a model not yet created: for a dataset, an architecture and
a per-release target, what each method would promise (its guarantee and the σ of its first
release), whether it can serve such a model at all, and what one deletion would cost, so the
dashboard's model form shows a table to choose from rather than a bare list of names."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.tables import Model, ModelVersion, Sample
from app.core.errors import APIError, unprocessable
from app.core.schemas import ModelCreate
from app.core.services.datasets import ready_dataset
from app.core.states import SampleStatus, VersionKind
from app.core.wire import MethodChoice, MethodChoices, Target
from methods import RETRAIN, get_method, method_names, method_of
from methods.floor import at_creation

NEWEST_TRAININGS = 50  # of the dataset's models, the trainings looked at for a measured time


def method_choices(
    session: Session,
    dataset_id: int,
    architecture: dict[str, Any],
    epsilon: float,
    delta: float,
    disclose: bool = False,
) -> MethodChoices:
    """One row per method, checked as POST /v1/models would check a model with its default
    options (a refusal is the API's own message), its first release planned at (ε, δ). The
    measured training time, a function of rows that may since have left, only for a caller
    who may see such values (`disclose`)."""
    ds = ready_dataset(session, dataset_id)
    try:
        ModelCreate.model_validate(
            {"name": "choice", "dataset_id": ds.id, "architecture": architecture}
        )
    except ValidationError as exc:
        raise unprocessable("invalid_architecture", _messages(exc)) from exc
    n_train = int(
        session.scalar(
            select(func.count()).where(
                Sample.dataset_id == ds.id,
                Sample.split == "train",
                Sample.status == SampleStatus.active,
            )
        )
        or 0
    )
    n_features = math.prod(ds.feature_shape)
    full, full_basis = (
        _measured_training(session, ds.id, str(architecture.get("type", "")))
        if disclose
        else (None, "measured trainings are disclosed to auditors and admins")
    )
    rows = [
        _row(name, ds.id, architecture, n_train, n_features, ds.n_classes, epsilon, delta, full)
        for name in method_names()
    ]
    return MethodChoices(
        dataset_id=ds.id,
        architecture=str(architecture.get("type", "")),
        target=Target(epsilon=epsilon, delta=delta),
        n_train=n_train,
        full_retrain_seconds=full,
        full_retrain_basis=full_basis,
        methods=rows,
    )


def _row(
    name: str,
    dataset_id: int,
    architecture: dict[str, Any],
    n_train: int,
    n_features: int,
    n_classes: int,
    epsilon: float,
    delta: float,
    full: float | None,
) -> MethodChoice:
    spec = get_method(name)
    refusal = None
    try:
        body = ModelCreate.model_validate(
            {
                "name": "choice",
                "dataset_id": dataset_id,
                "architecture": architecture,
                "method": {"name": name},
                "privacy": {"epsilon": epsilon, "delta": delta},
            }
        )
        choice = method_of(body.method.model_dump())
        choice.check_model(body.architecture, n_train, n_features)
        plan = choice.plan(epsilon, delta)
        # the body's policy is the table's target (ε, δ) with the default floor
        floor = at_creation(choice, body.architecture, n_features, n_classes, body.privacy)
        fraction, basis = _share(name, body)
    except ValidationError as exc:
        refusal = _messages(exc)
    except APIError as exc:
        refusal = exc.message[:500]
    if refusal is not None:
        return MethodChoice(
            method=name, summary=spec.summary, guarantee=str(spec.guarantee), refusal=refusal
        )
    if floor is not None and floor.below:  # POST /v1/models refuses it (below_utility_floor)
        return MethodChoice(
            method=name,
            summary=spec.summary,
            guarantee=str(plan.guarantee),
            sigma=plan.sigma,
            feasible=plan.feasible,
            refusal=f"every release would be the exact retrain: {floor.reason()}"[:500],
            below_floor=floor.figures(),
        )
    return MethodChoice(
        method=name,
        summary=spec.summary,
        guarantee=str(plan.guarantee),
        available=True,
        sigma=plan.sigma if plan.sigma > 0 else None,
        feasible=plan.feasible,
        reason=plan.reason,
        fraction_of_full_retrain=fraction,
        expected_compute_seconds=full * fraction if full is not None and fraction else None,
        cost_basis=basis,
    )


def _share(name: str, body: ModelCreate) -> tuple[float | None, str]:
    """A method's share of a full retrain per single-sample deletion, as the model's own
    deletion-cost table would estimate it before anything is measured."""
    if name == RETRAIN:
        return 1.0, "a full retrain"
    offered = get_method(name).offered_to
    defaults = method_of({"name": name}).options.model_dump()
    for entry in offered(body.architecture) if offered is not None else []:
        if all(defaults.get(k) == v for k, v in entry.options.items()):  # the form's options
            return entry.fraction, entry.basis
    return None, "measured once the model has made its first updates"


def _measured_training(
    session: Session, dataset_id: int, architecture_type: str
) -> tuple[float | None, str]:
    """The newest measured full training of a model of this architecture on this dataset."""
    rows = session.execute(
        select(Model.id, Model.architecture, ModelVersion.metrics)
        .join(ModelVersion, ModelVersion.model_id == Model.id)
        .where(
            Model.dataset_id == dataset_id,
            ModelVersion.kind.in_([VersionKind.trained, VersionKind.retrained]),
        )
        .order_by(ModelVersion.id.desc())
        .limit(NEWEST_TRAININGS)
    ).all()
    for model_id, architecture, metrics in rows:
        seconds = (metrics or {}).get("train_seconds")
        if architecture.type == architecture_type and isinstance(seconds, int | float):
            return float(seconds), f"measured: model {model_id}'s latest full training"
    return None, "no model of this architecture has been trained on this dataset yet"


def _messages(exc: ValidationError) -> str:
    return "; ".join(str(e.get("msg", "")) for e in exc.errors())[:500]
