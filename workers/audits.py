"""The privacy-audit job: load the model's recipe, retained rows and test split in
one short read, run the canary experiment (workers/privacy_audit.py) with no transaction open,
then commit the result and its audit-log entry together.

An audit changes no model: it holds no lease and runs beside the model's deletions. Each claim
counts an attempt; only the attempt that claimed last may commit, so an audit re-signalled
after a crash (the reconciler re-signals one left `running` past the job timeout) is logged
once. The canaries, the shadow's states and the scores exist only inside `privacy_audit.run`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session

from app.core import shutdown
from app.core.db.session import Database
from app.core.db.tables import Dataset, Model, ModelVersion, PrivacyAudit, utcnow
from app.core.dispatch import AUDIT, take_signal
from app.core.jsontypes import JsonObject
from app.core.ledger.certificates import append_certificate
from app.core.ledger.transparency import signing_key
from app.core.specs import PrivacyPolicy
from app.core.states import AuditStatus, ModelStatus
from app.core.webhooks import events
from methods.compute import ModelSpec, RetainedData
from workers import load
from workers.context import JobContext
from workers.data import OpenedSamples, test_arrays, training_arrays
from workers.privacy_audit import AuditOptions, AuditRun, run

log = logging.getLogger("lethe.audits")


@dataclass(frozen=True)
class AuditInputs:
    attempt: int
    model_id: int
    version: int
    spec: ModelSpec
    policy: PrivacyPolicy
    options: AuditOptions
    retained: RetainedData
    test: RetainedData
    seed: int | None


def run_audit(ctx: JobContext, audit_id: int) -> str:
    """Run one queued audit to its result (or its error)."""
    take_signal(AUDIT, audit_id)
    settings, db = ctx.settings, ctx.db
    attempt = _claim(db, audit_id)
    if attempt is None:
        return "nothing to do"
    try:
        with db.read() as session:
            inputs = _load(session, ctx.opened, audit_id, attempt)
        result = run(
            inputs.spec,
            inputs.policy,
            inputs.retained,
            inputs.test,
            inputs.options,
            stage=lambda stage: _staged(db, audit_id, attempt, stage),
            seed=inputs.seed,
        )
    except Exception as exc:
        log.warning("audit %s failed", audit_id, exc_info=True)
        _fail(db, audit_id, attempt, _described(exc))
        return "failed"
    signer = signing_key(settings)
    committed = db.run(lambda session: _commit(session, audit_id, inputs, result, signer))
    if committed:
        ctx.runtime.publisher.soon()
    return "done" if committed else "superseded"


def _staged(db: Database, audit_id: int, attempt: int, stage: str) -> None:
    """A new stage, after the deletions waiting in this worker have run (a
    deletion waits at most for one stage of an audit)."""
    shutdown.run_waiting_deletions()
    _stage(db, audit_id, attempt, stage)


def _claim(db: Database, audit_id: int) -> int | None:
    """Mark the audit running and count the attempt; None when it is already finished."""
    with db.write() as session:
        audit = session.get(PrivacyAudit, audit_id)
        if audit is None or audit.status in (AuditStatus.done, AuditStatus.failed):
            return None
        audit.status = AuditStatus.running
        audit.attempts += 1
        audit.stage = "loading"
        audit.started_at = utcnow()
        return audit.attempts


def _load(session: Session, opened: OpenedSamples, audit_id: int, attempt: int) -> AuditInputs:
    audit = session.get(PrivacyAudit, audit_id)
    assert audit is not None
    model = session.get(Model, audit.model_id)
    if model is None or model.status != ModelStatus.ready or model.current_version_id is None:
        raise LookupError("the model has no released version to audit")
    dataset = session.get(Dataset, model.dataset_id)
    version = session.get(ModelVersion, model.current_version_id)
    assert dataset is not None and version is not None
    rows = training_arrays(session, opened, model.id, dataset)
    test = test_arrays(session, opened, dataset)
    o = audit.options
    return AuditInputs(
        attempt=attempt,
        model_id=model.id,
        version=version.number,
        spec=load.model_spec(model, dataset),
        policy=model.privacy,
        options=AuditOptions(
            canaries=int(o["canaries"]),
            kind=o["kind"],
            score=o["score"],
            confidence=float(o["confidence"]),
            control=bool(o["control"]),
            sequence=int(o.get("sequence", 1)),  # audits recorded before it: one release
        ),
        retained=RetainedData(rows.sample_ids, rows.X, rows.y, rows.subjects, rows.external_ids),
        test=RetainedData(test.sample_ids, test.X, test.y),
        seed=o.get("seed"),
    )


def _mine(audit_id: int, attempt: int) -> tuple[ColumnElement[bool], ...]:
    return (
        PrivacyAudit.id == audit_id,
        PrivacyAudit.status == AuditStatus.running,
        PrivacyAudit.attempts == attempt,
    )


def _stage(db: Database, audit_id: int, attempt: int, stage: str) -> None:
    with db.write(durable=False) as session:
        session.execute(update(PrivacyAudit).where(*_mine(audit_id, attempt)).values(stage=stage))


def _fail(db: Database, audit_id: int, attempt: int, error: str) -> None:
    with db.write() as session:
        session.execute(
            update(PrivacyAudit)
            .where(*_mine(audit_id, attempt))
            .values(status=AuditStatus.failed, stage=None, error=error, finished_at=utcnow())
        )


def _described(exc: Exception) -> str:
    """What the audit's record may say of a failure: the message of a refusal we raise, else
    only the error's type (a message could carry values of the data)."""
    if isinstance(exc, LookupError | ValueError):
        return str(exc)
    return f"the audit could not run: {type(exc).__name__} (see the worker's log)"


def _commit(
    session: Session,
    audit_id: int,
    inputs: AuditInputs,
    result: AuditRun,
    signer: Ed25519PrivateKey,
) -> bool:
    """The result and its audit-log entry in one transaction, if this attempt still owns the
    audit."""
    audit = session.get(PrivacyAudit, audit_id, with_for_update=True)
    if audit is None or audit.status != AuditStatus.running or audit.attempts != inputs.attempt:
        return False
    document = result.document()
    entry = append_certificate(session, entry_fields(audit, inputs, result), signer)
    audit.status = AuditStatus.done
    audit.stage = None
    audit.result = document
    audit.certificate_id = entry.id
    audit.finished_at = utcnow()
    events.audit_completed(session, audit.id, audit.model_id, result.verdict)
    return True


def entry_fields(audit: PrivacyAudit, inputs: AuditInputs, result: AuditRun) -> JsonObject:
    """The audit's entry in the log: a certificate-like record of its parameters and figures
    (request 0: no deletion request's; no ε of its own: it audits the model's)."""
    o = inputs.options
    return {
        "kind": "privacy_audit",
        "audit_id": audit.id,
        "request_id": 0,
        "model_id": inputs.model_id,
        "from_version": inputs.version,
        "to_version": inputs.version,
        "method": result.method,
        "guarantee": "audit",
        "epsilon": None,
        "delta": None,
        "cumulative_epsilon": None,
        "cumulative_delta": None,
        "n_removed": 0,
        "options": {
            "canaries": o.canaries,
            "kind": o.kind,
            "score": o.score,
            "confidence": o.confidence,
            "control": o.control,
            "seed": inputs.seed,
        },
        "result": result.document(),
        "sentence": sentence(result, o.canaries),
    }


def sentence(result: AuditRun, canaries: int) -> str:
    """The result in one sentence: the joint test of the certificate's own ε."""
    joint = result.bounds.joint
    if result.certified_epsilon is None or joint is None:
        return (
            f"With {canaries} canaries the release's joint lower bound on ε is "
            f"{joint.epsilon if joint else 0.0:.3g}; its method is heuristic and certifies "
            "nothing to compare with."
        )
    return (
        f"With {canaries} canaries the release's certificate (ε={result.certified_epsilon:.3g}) "
        f"was tested by its own claim: the audit proves ε ≥ {joint.epsilon:.3g} at 95 % "
        f"confidence ({joint.statistic}, {joint.statistics} statistics); a perfect attack "
        f"could show at most {joint.ceiling:.3g}; per canary the one-run bound is "
        f"{result.bounds.one_run.epsilon:.3g} against ε′ = {result.implied_epsilon:.3g}: "
        f"{result.verdict}."
    )
