"""Privacy views that need the database: a model's lineage and the release preview."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.tables import Certificate
from app.errors import unprocessable
from app.privacy.lineage import compose_events, gaussian_event
from app.privacy.plans import release_plan
from app.privacy.validate import PrivacyParameterError
from app.services.models import get_model


def lineage_events(session: Session, model_id: int) -> list[dict[str, Any]]:
    """Every noisy release since the model's last exact retrain, from the audit log (one per
    version: coalesced requests share a release)."""
    bodies = session.scalars(
        select(Certificate.body).where(Certificate.model_id == model_id).order_by(Certificate.seq)
    ).all()
    releases: dict[int, dict[str, Any]] = {}
    for body in bodies:
        doc = json.loads(body)
        if doc.get("lineage_reset") or doc.get("guarantee") == "exact":
            releases.clear()
        elif doc.get("lineage_event"):
            releases[doc["to_version"]] = doc["lineage_event"]
        elif doc.get("sensitivity", 0) > 0 and doc.get("sigma", 0) > 0:
            releases[doc["to_version"]] = gaussian_event(
                doc["sigma"], doc["sensitivity"], doc["epsilon"], doc["delta"]
            )
    return list(releases.values())


def preview(
    session: Session, model_id: int, epsilon: float | None, delta: float | None
) -> dict[str, Any]:
    """σ, feasibility and lineage cost of the model's next release, before any request."""
    model = get_model(session, model_id)
    policy = model.privacy
    eps = policy["epsilon"] if epsilon is None else epsilon
    dlt = policy["delta"] if delta is None else delta
    try:
        plan = release_plan(model.method, eps, dlt)
    except PrivacyParameterError as exc:
        raise unprocessable("invalid_privacy_target", str(exc)) from exc
    if eps > policy["epsilon"] or dlt > policy["delta"]:
        raise unprocessable(
            "target_looser_than_policy",
            f"(ε={eps:g}, δ={dlt:g}) is looser than model {model_id}'s policy "
            f"(ε={policy['epsilon']:g}, δ={policy['delta']:g})",
        )
    history = lineage_events(session, model_id)
    spent = compose_events(history, policy["lineage_delta"])
    after = compose_events([*history, plan.event], policy["lineage_delta"]) if plan.event else spent
    fallback = (
        plan.feasible is False
        or after.epsilon > policy["lineage_epsilon"]
        or after.delta > policy["lineage_delta"]
    )
    return {
        "model_id": model_id,
        "method": plan.method,
        "guarantee": plan.guarantee,
        "target": {"epsilon": eps, "delta": dlt},
        "sigma": plan.sigma,
        "sensitivity": plan.sensitivity,
        "noise_multiplier": plan.noise_multiplier,
        "feasible": plan.feasible,
        "reason": plan.reason,
        "constants": plan.constants,
        "lineage": {
            "budget_epsilon": policy["lineage_epsilon"],
            "budget_delta": policy["lineage_delta"],
            "releases_since_reset": len(history),
            "spent_epsilon": spent.epsilon,
            "epsilon_after_release": after.epsilon,
            "budget_used_by_release": after.epsilon - spent.epsilon,
            "accountant": after.accountant,
        },
        "would_retrain_exactly": fallback,
    }
