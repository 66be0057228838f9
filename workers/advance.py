"""Moving a worker's resident session to the version an update just committed:
the same step after a deletion batch (workers/deletions.py) and after a learned version
(workers/learning.py)."""

from __future__ import annotations

import json
import logging

from app.core.jsontypes import JsonMap, json_object
from app.privacy.lineage import LineageBudget, history_after, prepare_next
from workers.certify import lineage_fields
from workers.resident import Sessions
from workers.values import Batch, Outcome

log = logging.getLogger("lethe.jobs")


def keep_resident(
    sessions: Sessions,
    where: str,
    batch: Batch,
    outcome: Outcome | None,
    version_id: int | None,
) -> None:
    """Move the batch's session to the version just committed, its removed rows gone (their
    plaintext leaves this worker's memory with the commit); unchanged when nothing was
    removed (no new version). A learned version's session comes grown by its rows
    (`ModelSession.grown`) in `batch.session`."""
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
    sessions.put(
        where,
        batch.session.advance(version_id, batch.removed, state, release.resident, history, record),
    )
    if history and release.event is not None:  # the next noisy release's ε, solved now
        try:
            policy = batch.policy
            prepare_next(LineageBudget(policy.lineage_epsilon, policy.lineage_delta), history)
        except Exception:  # noqa: BLE001 - only a head start: the admission solves it anyway
            log.debug("could not prepare the next admission of model %s", batch.model_id)


def as_stored(record: JsonMap | None) -> JsonMap | None:
    """A release's training record as a read of its version's metrics gives it back."""
    return json.loads(json.dumps(json_object(record))) if record else None
