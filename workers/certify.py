"""The one place that turns an update's decision into a request's certificate fields (DESIGN
§6–7): `certificate_for` (the commitment and the certificate's place), `certificate_fields`
(the guarantee, ε, δ and every constant); the log chains and signs them
(app/core/ledger/certificates.py)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

# a worker certifies: the accountant app/privacy imports on first use loads with its jobs, so
# its first deletion does not wait for it
import dp_accounting  # noqa: F401

from app.core.jsontypes import JsonObject
from app.core.ledger.certificate_body import SCHEMA_VERSION, DeletionCertificate
from app.core.ledger.certificates import (
    COMMITMENT_SCHEME,
    RESTRICTED,
    constant_commitment,
    removed_ids_commitment,
)
from app.core.specs import PrivacyPolicy
from app.core.states import Guarantee
from app.privacy import DP_ACCOUNTING_VERSION
from app.privacy.lineage import event_to_json
from methods.compute import CertificateFields, Constant, PrivacyTarget
from workers.values import Batch, ClaimedTask, Decision, Fallback, Outcome, Released


@dataclass(frozen=True)
class CertificateContext:
    """Where a certificate sits: the request, the versions and what was removed."""

    request_id: int
    model_id: int
    from_version: int
    to_version: int
    release_sha256: str
    n_removed: int
    n_removed_in_update: int
    coalesced_requests: list[int]
    removed_ids_commitment: str
    chosen_by: str | None = None


def _publication(policy: PrivacyPolicy) -> JsonObject:
    """The policy's constant-time publication, where it sets one."""
    after = policy.publish_after_seconds
    return {} if after is None else {"publish_after_seconds": after}


def lineage_fields(decision: Decision) -> JsonObject:
    """The fields of a release's certificates that its lineage reads (`app/privacy/lineage`):
    the guarantee, whether it resets the lineage, and the noisy release it counts."""
    cert, event = decision.release.certificate, decision.release.event
    return {
        "guarantee": str(cert.guarantee),
        "lineage_reset": cert.resets_lineage,
        "lineage_event": event_to_json(event) if event is not None else None,
    }


def certificate_for(
    batch: Batch,
    task: ClaimedTask,
    outcome: Outcome,
    to_version: int,
    release_sha256: str,
    removed: list[int],
) -> dict[str, Any]:
    """One request's certificate fields for an update: its commitment to the removed ids
    (under the request's kept opening) and its place, then `certificate_fields`."""
    # A request without a kept key (accepted by an older version) commits under a key nobody
    # keeps: the commitment cannot be opened, by anyone, which is what it must not leak.
    opening = batch.openings.get(task.request_id) or secrets.token_bytes(32)
    commitment = removed_ids_commitment(opening, [batch.external_ids[s] for s in removed])
    ctx = CertificateContext(
        request_id=task.request_id,
        model_id=batch.model_id,
        from_version=batch.parent_number,
        to_version=to_version,
        release_sha256=release_sha256,
        n_removed=len(removed),
        n_removed_in_update=len(batch.removed),
        coalesced_requests=sorted({t.request_id for t in batch.tasks}),
        removed_ids_commitment=commitment,
        chosen_by=batch.chosen_by,
    )
    return certificate_fields(outcome.decision, batch.policy, batch.target(), ctx)


def certificate_fields(
    decision: Decision, policy: PrivacyPolicy, target: PrivacyTarget, ctx: CertificateContext
) -> JsonObject:
    """Every field of one request's certificate, every number checked finite."""
    cert = decision.release.certificate
    admission = decision.admission
    spend = admission.after if admission is not None else None
    noisy = spend is not None and spend.releases > 0
    fallback_reason = decision.reason if isinstance(decision, Fallback) else None
    sentence = _sentence(cert.sentence, spend if noisy else None, policy, fallback_reason)
    constants, restricted = _constants(cert.constants)
    others = _others_business(decision, ctx)
    hidden = {name: _sealed(value) for name, value in others.items()}
    body = DeletionCertificate(
        schema_version=SCHEMA_VERSION,
        **{name: shown for name, (shown, _) in hidden.items()},
        request_id=ctx.request_id,
        model_id=ctx.model_id,
        from_version=ctx.from_version,
        to_version=ctx.to_version,
        method=decision.method,
        **({"method_chosen_by": ctx.chosen_by} if ctx.chosen_by else {}),
        epsilon=_claim(cert.epsilon),
        delta=_claim(cert.delta),
        sigma=_finite(cert.sigma),
        sensitivity=_finite(cert.sensitivity),
        accountant=cert.accountant,
        constants=constants,
        **_spent(cert, spend, noisy, policy),
        **lineage_fields(decision),
        fallback_reason=fallback_reason,
        **_publication(policy),
        target={"epsilon": target.epsilon, "delta": target.delta},
        n_removed=ctx.n_removed,
        removed_ids_commitment=ctx.removed_ids_commitment,
        commitment_scheme=COMMITMENT_SCHEME,
        release_sha256=ctx.release_sha256,
        compares=cert.compares,
        sentence=sentence,
        **(cert.details or {}),
    )
    sealed: JsonObject = {
        "constants": restricted,
        "fields": {name: opened for name, (_, opened) in hidden.items()},
    }
    return {RESTRICTED: sealed, **body.body()}


def _spent(cert: CertificateFields, spend: Any, noisy: bool, policy: PrivacyPolicy) -> JsonObject:
    """The lineage after this release: what its noisy releases spend together, against the
    model's budget, and the accountants that composed them."""
    return {
        "accountant_versions": {
            "dp-accounting": DP_ACCOUNTING_VERSION,
            "lineage": spend.accountant if spend is not None else None,
        },
        "cumulative_epsilon": _cumulative(cert, spend.epsilon if spend and noisy else 0.0),
        "cumulative_delta": _cumulative(cert, spend.delta if spend and noisy else 0.0),
        "lineage": {
            "releases_since_reset": spend.releases if spend is not None else 0,
            "budget_epsilon": policy.lineage_epsilon,
            "budget_delta": policy.lineage_delta,
        },
    }


def _sentence(said: str, spend: Any, policy: PrivacyPolicy, fallback_reason: str | None) -> str:
    """The method's sentence, with the lineage's noisy releases (`spend`, where any) and the
    reason the exact retrain was used."""
    if spend is not None:
        said += (
            f" Since its last exact retrain this model has made {spend.releases} "
            f"noisy release(s), together (ε={spend.epsilon:.4g}, δ={spend.delta:.3g}) "
            f"of its lineage budget ε={policy.lineage_epsilon:g}."
        )
    if fallback_reason:
        said += f" Exact retraining was used because {fallback_reason}."
    if policy.publish_after_seconds is not None:
        said += (
            f" It was published no earlier than {policy.publish_after_seconds:g} s after the "
            "newest request it serves was accepted, so the time to publication does not tell "
            "which branch ran unless the update took longer."
        )
    return said


def _others_business(decision: Decision, ctx: CertificateContext) -> dict[str, Any]:
    """What concerns other requesters (their ids, the batch's size) and, where it depends on
    the removed rows, which branch ran: a receipt (the logged body) carries commitments to
    them, auditors the values."""
    others: dict[str, Any] = {
        "coalesced_requests": ctx.coalesced_requests,
        "n_removed_in_update": ctx.n_removed_in_update,
    }
    if isinstance(decision, Released) and decision.hides_branch:
        others["branch"] = decision.branch or "method"  # or the retrain's reason
    return others


def _constants(
    constants: dict[str, Constant],
) -> tuple[JsonObject, JsonObject]:
    """The body's constants, and the restricted ones' values with their salts. A restricted
    constant shows no value in the body: a salted sha256 commitment to it (an auditor given
    value and salt checks it against the log) and what the decision needs (`public`)."""
    body: JsonObject = {}
    restricted: JsonObject = {}
    for name, c in constants.items():
        value = _finite(c.value)
        if c.disclosure == "public":
            body[name] = {"value": value, "source": c.source, "meaning": c.meaning}
            continue
        shown, restricted[name] = _sealed(value)
        body[name] = {
            "value": None,
            "source": c.source,
            "meaning": c.meaning,
            "public": c.public,
            **shown,
        }
    return body, restricted


def _sealed(value: Any) -> tuple[JsonObject, JsonObject]:
    """What the body shows of a restricted value (a salted commitment) and what auditors get
    (the value and the salt that opens it)."""
    salt = secrets.token_hex(16)
    shown: JsonObject = {
        "disclosed_to": "auditors and admins",
        "commitment": constant_commitment(salt, value),
    }
    return shown, {"value": value, "salt": salt}


def _claim(x: float | None) -> float | None:
    """A certificate's ε or δ; None only for a heuristic, which claims nothing."""
    return None if x is None else _finite(x)


def _cumulative(cert: CertificateFields, spent: float) -> float | None:
    """The lineage spend after this release; a heuristic release states none (it is not an
    (ε, δ) release and leaves the lineage as it was)."""
    return None if cert.guarantee == Guarantee.none else _finite(spent)


def _finite(x: float) -> float:
    if not math.isfinite(float(x)):
        raise ValueError(f"refusing to certify a non-finite value {x!r}")
    return float(x)
