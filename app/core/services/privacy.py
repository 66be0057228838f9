"""Privacy views that need the database: a model's lineage history and the release preview."""

from __future__ import annotations

from math import prod

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.tables import Dataset, Model, ModelVersion
from app.core.errors import unprocessable
from app.core.jsontypes import JsonObject
from app.core.ledger.certificates import lineage_history, recent_certificate_documents
from app.core.services.deletion_cost import deletion_cost
from app.core.services.models import get_model
from app.core.services.utility_floor import floor_view
from app.core.states import VersionKind
from app.core.wire import LineagePreview, PreviewOut, Target
from app.privacy.lineage import LineageBudget, admit
from app.privacy.plans import ReleasePlan
from app.privacy.validate import PrivacyParameterError
from methods import method_of
from methods.spec import PreviewFacts

RECENT = 10  # certificates the preview shows of a measured-shift method


def preview(
    session: Session,
    model_id: int,
    epsilon: float | None,
    delta: float | None,
    disclose: bool = False,
) -> PreviewOut:
    """σ, feasibility and lineage cost of the model's next release, before any request
    (`disclose`: the caller may see measured values that are functions of removed data)."""
    model = get_model(session, model_id)
    policy = model.privacy
    eps = policy.epsilon if epsilon is None else epsilon
    dlt = policy.delta if delta is None else delta
    current = (
        session.get(ModelVersion, model.current_version_id) if model.current_version_id else None
    )
    recorded = (current.metrics or {}).get("plan_inputs") if current is not None else None
    try:
        plan = method_of(model.method).plan_next(eps, dlt, recorded)
    except PrivacyParameterError as exc:
        raise unprocessable("invalid_privacy_target", str(exc)) from exc
    if eps > policy.epsilon or dlt > policy.delta:
        raise unprocessable(
            "target_looser_than_policy",
            f"(ε={eps:g}, δ={dlt:g}) is looser than model {model_id}'s policy "
            f"(ε={policy.epsilon:g}, δ={policy.delta:g})",
        )
    documents = recent_certificate_documents(session, model_id, 10 * RECENT, disclose=disclose)
    history = lineage_history(session, model_id)
    budget = LineageBudget(policy.lineage_epsilon, policy.lineage_delta)
    admission = admit(budget, history, plan.event)
    after = admission.after if plan.event is not None else admission.spent
    dataset = session.get(Dataset, model.dataset_id)
    assert dataset is not None
    floor = floor_view(session, model, plan, prod(dataset.feature_shape), dataset.n_classes)
    return PreviewOut(
        model_id=model_id,
        method=plan.method,
        guarantee=plan.guarantee,
        target=Target(epsilon=eps, delta=dlt),
        sigma=plan.sigma,
        sensitivity=plan.sensitivity,
        noise_multiplier=plan.noise_multiplier,
        feasible=plan.feasible,
        reason=plan.reason,
        constants=plan.constants,
        lineage=LineagePreview(
            budget_epsilon=policy.lineage_epsilon,
            budget_delta=policy.lineage_delta,
            releases_since_reset=len(history),
            spent_epsilon=admission.spent.epsilon,
            epsilon_after_release=after.epsilon,
            budget_used_by_release=after.epsilon - admission.spent.epsilon,
            accountant=after.accountant,
        ),
        would_retrain_exactly=(
            plan.feasible is False or not admission.admitted or (floor is not None and floor.below)
        ),
        utility_floor=floor,
        deletion_capacity=_capacity_view(plan, current),
        # timings of trainings and updates, each a function of rows since removed
        deletion_cost=deletion_cost(session, model, disclose) if disclose else None,
        learned_versions=learned_versions(session, model_id),
        # a measured-shift method's extras replace it
        **{"shift": None, **_extras(session, model, plan.sigma, documents, disclose)},
    )


def _capacity_view(plan: ReleasePlan, version: ModelVersion | None) -> JsonObject | None:
    """For a method with a deletion capacity (the topic models): the documents removed since
    the last training against the capacity at the previewed target, which is what the next
    request checks (it used to show a fixed (1, 1e-5)). A version made before it
    recorded `plan_inputs` shows the capacity it was released under, as before."""
    metrics = (version.metrics or {}) if version is not None else {}
    if plan.capacity is not None:
        limit = {k: v for k, v in plan.capacity.items() if k != "removed_since_training"}
        used = int(plan.capacity.get("removed_since_training", 0))
    elif metrics.get("deletion_capacity"):
        limit = metrics["deletion_capacity"]
        used = int(metrics.get("removed_documents_cumulative", 0))
    else:
        return None
    terms: JsonObject = dict(limit)
    return {
        "capacity_documents": limit["documents"],
        "terms": terms,
        "removed_since_training": used,
        "left": max(0.0, limit["documents"] - used),
        "then": "past the capacity Lethe retrains exactly and the count restarts at 0",
    }


def _extras(
    session: Session,
    model: Model,
    sigma: float,
    documents: list[JsonObject],
    disclose: bool,
) -> JsonObject:
    """The method's own part of the preview (its `preview_extras` hook), for a trained model."""
    method = method_of(model.method)
    hook = method.spec.preview_extras
    if hook is None or model.current_version_id is None:
        return {}
    version = session.get(ModelVersion, model.current_version_id)
    dataset = session.get(Dataset, model.dataset_id)
    assert version is not None and dataset is not None
    facts = PreviewFacts(
        sigma=sigma,
        n_features=prod(dataset.feature_shape),
        n_classes=dataset.n_classes,
        version_metrics=version.metrics or {},
        recent=documents,
        disclose=disclose,
    )
    return hook(method.options, facts)


def learned_versions(session: Session, model_id: int) -> int:
    """How many of the model's versions learned appended rows."""
    found = session.scalar(
        select(func.count())
        .select_from(ModelVersion)
        .where(ModelVersion.model_id == model_id, ModelVersion.kind == VersionKind.learned)
    )
    return int(found or 0)
