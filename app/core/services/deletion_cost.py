"""What one deletion is expected to cost a model under each method that could serve it, so a
user can choose with numbers: measured where the model has measured it (its own
training and updates), estimated (and said so) where it has not."""

from __future__ import annotations

from statistics import median
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import Model, ModelVersion
from app.core.jsontypes import JsonObject
from app.core.specs import architecture_of
from app.core.states import VersionKind
from app.core.wire import CostRow, DeletionCost, MeasuredUpdates
from methods import RETRAIN, get_method, method_names, method_of

TRAINING_KINDS = (VersionKind.trained, VersionKind.retrained)


def deletion_cost(session: Session, model: Model, disclose: bool = False) -> DeletionCost | None:
    """Expected seconds and share of a full retrain for one single-sample deletion. The
    per-update timings are functions of the removed rows and of which branch ran:
    only a caller who may see such values (`disclose`: admins, auditors) gets them."""
    rows = session.execute(
        select(ModelVersion.number, ModelVersion.kind, ModelVersion.metrics)
        .where(ModelVersion.model_id == model.id)
        .order_by(ModelVersion.number)
    ).all()
    trainings = [m for _, kind, m in rows if kind in TRAINING_KINDS and m.get("train_seconds")]
    if not trainings:
        return None  # not trained yet, or imported: nothing measured to scale from
    full = float(trainings[-1]["train_seconds"])
    own = method_of(model.method)
    current = rows[-1][2] if rows else {}
    entries = [_entry(RETRAIN, {}, full, 1.0, "measured: the model's latest full training")]
    if own.spec.own_cost is not None:  # the method knows its share from the model's shape
        cost = own.spec.own_cost(own.options, current)
        measured = _measured_updates(rows, own.name) if disclose else None
        entries.append(
            _entry(
                own.name, cost.options, full * cost.fraction, cost.fraction, cost.basis, measured
            )
        )
    elif own.name != RETRAIN:
        updates = _measured_updates(rows, own.name) if disclose else []
        seconds = median(updates) if updates else None
        basis = (
            f"measured: median of this model's {len(updates)} {own.name} update(s)"
            if updates
            else "no update measured yet"
            if disclose
            else "measured per update: disclosed to auditors and admins"
        )
        entries.append(_entry(own.name, {}, seconds, _ratio(seconds, full), basis, updates))
    architecture = architecture_of(model.architecture)
    for name in method_names():  # methods that offer themselves to other models
        other = get_method(name)
        if name == own.name or other.offered_to is None:
            continue
        for cost in other.offered_to(architecture):
            entries.append(
                _entry(name, cost.options, full * cost.fraction, cost.fraction, cost.basis)
            )
    return DeletionCost(full_retrain_seconds=full, methods=entries)


def _entry(
    method: str,
    options: JsonObject,
    seconds: float | None,
    fraction: float | None,
    basis: str,
    measured: list[float] | None = None,
) -> CostRow:
    return CostRow(
        method=method,
        options=options,
        expected_compute_seconds=seconds,
        fraction_of_full_retrain=fraction,
        basis=basis,
        measured_update_seconds=(
            MeasuredUpdates(count=len(measured), median=median(measured)) if measured else None
        ),
    )


def _measured_updates(rows: Any, method: str) -> list[float]:
    return [
        float(m["unlearn_seconds"])
        for _, kind, m in rows
        if kind == VersionKind.unlearned and m.get("method") == method and "unlearn_seconds" in m
    ][-20:]


def _ratio(seconds: float | None, full: float) -> float | None:
    return None if seconds is None or full <= 0 else seconds / full
