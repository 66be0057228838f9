"""Moving a worker's resident session to the version an update just committed:
the same step after a deletion batch (workers/deletions.py) and after a learned version
(workers/learning.py)."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from app.core import shutdown
from app.core.jsontypes import JsonMap, json_object
from app.privacy.lineage import LineageBudget, history_after, prepare_next
from methods.compute import UnlearningMethod
from workers.certify import lineage_fields
from workers.resident import ModelSession, Sessions
from workers.updates import RESIDENT_READY
from workers.values import Batch, Outcome

log = logging.getLogger("lethe.jobs")


def keep_resident(
    sessions: Sessions,
    where: str,
    batch: Batch,
    outcome: Outcome | None,
    version_id: int | None,
    method: UnlearningMethod | None = None,
) -> None:
    """Move the batch's session to the version just committed, its removed rows gone (their
    plaintext leaves this worker's memory with the commit); unchanged when nothing was
    removed (no new version). A learned version's session comes grown by its rows
    (`ModelSession.grown`) in `batch.session`. A release that left no resident state has
    `method` prepare one now, after the commit, so the next request does not pay for it
    (convex_head's anchored Hessian: a pass over every row; its exact retrain leaves one)."""
    if batch.session is None:
        return
    if outcome is None or version_id is None:
        sessions.put(where, batch.session)
        return
    release = outcome.decision.release
    state = {k: v.detach().cpu() for k, v in release.next_state.items()}
    before = batch.session.history
    history = (
        tuple(history_after(before, lineage_fields(outcome.decision)))
        if before is not None
        else None
    )
    kept = batch.session.record
    record = kept.after(batch.removed, as_stored(release.record)) if kept is not None else None
    advanced = batch.session.advance(
        version_id, batch.removed, state, release.resident, history, record
    )
    sessions.put(where, advanced)
    if release.resident is None and method is not None:
        _prepare(sessions, where, advanced, method)
    if history and release.event is not None:  # the next noisy release's ε, solved now
        try:
            policy = batch.policy
            prepare_next(LineageBudget(policy.lineage_epsilon, policy.lineage_delta), history)
        except Exception:  # noqa: BLE001 - only a head start: the admission solves it anyway
            log.debug("could not prepare the next admission of model %s", batch.model_id)


def _prepare(
    sessions: Sessions, where: str, session: ModelSession, method: UnlearningMethod
) -> None:
    """`method`'s resident state for `session`'s version, put with it; the session stays as it
    was when preparing fails (the next update anchors itself)."""
    fresh = _prepared(session, method)
    if fresh is not None:
        sessions.put(where, fresh)
        log.info("model %s: %s (prepared)", session.model_id, RESIDENT_READY)


def _prepared(session: ModelSession, method: UnlearningMethod) -> ModelSession | None:
    """`session` with `method`'s resident state prepared for it; None when the method keeps
    none or preparing failed (logged)."""
    try:
        _, retained = session.split([], {}, [])
        prepared = method.prepare(retained, dict(session.state))
    except shutdown.Interrupted:
        return None
    except Exception:  # noqa: BLE001 - only a head start for the next update
        log.warning(
            "model %s: preparing the resident state failed", session.model_id, exc_info=True
        )
        return None
    return None if prepared is None else replace(session, method_state=prepared)


def as_stored(record: JsonMap | None) -> JsonMap | None:
    """A release's training record as a read of its version's metrics gives it back."""
    return json.loads(json.dumps(json_object(record))) if record else None
