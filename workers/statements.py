"""The claim's, the load's and the commit's SQL, built once on the tables and run on the
session's connection.

Building a statement and running it through the ORM session cost more of a worker's CPU
than PostgreSQL spent executing it. These are Core statements
with bound (expanding where a list) parameters, so each is compiled once per process and
cached, run executemany where there is a row each.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BindParameter,
    bindparam,
    delete,
    func,
    null,
    select,
    union_all,
    update,
)

from app.core.db.tables import Base, task_is_due

MODELS, VERSIONS, TASKS, REQUESTS, MODEL_SAMPLES, SAMPLES, SHORT_KEYS, BLOBS = (
    Base.metadata.tables[t]
    for t in (
        "models",
        "model_versions",
        "deletion_tasks",
        "deletion_requests",
        "model_samples",
        "samples",
        "short_keys",
        "blobs",
    )
)

_IDS: BindParameter[list[Any]] = bindparam("ids", expanding=True)

# a model's next batch: its due queued tasks with their requests, none unless it is ready
# (no parameter is named after a column: an UPDATE adds such a parameter to its SET)
CLAIMABLE = (
    select(
        TASKS.c.id,
        REQUESTS.c.id.label("request_id"),
        REQUESTS.c.sample_ids,
        REQUESTS.c.method,
        REQUESTS.c.epsilon,
        REQUESTS.c.delta,
    )
    .join(REQUESTS, REQUESTS.c.id == TASKS.c.request_id)
    .where(
        TASKS.c.model_id == bindparam("model"),
        TASKS.c.status == bindparam("queued"),
        task_is_due(bindparam("now", type_=TASKS.c.not_before.type)),
        select(MODELS.c.id)
        .where(MODELS.c.id == bindparam("model"), MODELS.c.status == bindparam("ready"))
        .exists(),
    )
    .order_by(TASKS.c.id)
    .limit(bindparam("limit"))
)
_CLAIMED: dict[str, Any] = {
    "status": bindparam("running"),
    "lease_owner": bindparam("owner"),
    "lease_expires_at": bindparam("deadline"),
    "attempts": TASKS.c.attempts + 1,
    "updated_at": bindparam("now"),
}
_STARTED: dict[str, Any] = {"status": bindparam("request_running"), "updated_at": bindparam("now")}
CLAIM_TASKS = update(TASKS).where(TASKS.c.id.in_(_IDS)).values(_CLAIMED)
START_REQUESTS = (
    update(REQUESTS)
    .where(REQUESTS.c.id.in_(_IDS), REQUESTS.c.status == bindparam("request_queued"))
    .values(_STARTED)
)
# PostgreSQL: the three above in one statement (data-modifying CTEs run whether or not the
# SELECT reads them; all three see one snapshot): two round trips less per claim
_CLAIMABLE = CLAIMABLE.cte("claimable")
CLAIM_AT_ONCE = (
    select(_CLAIMABLE)
    .add_cte(
        update(TASKS)
        .where(TASKS.c.id.in_(select(_CLAIMABLE.c.id)))
        .values(_CLAIMED)
        .cte("claimed"),
        update(REQUESTS)
        .where(
            REQUESTS.c.id.in_(select(_CLAIMABLE.c.request_id)),
            REQUESTS.c.status == bindparam("request_queued"),
        )
        .values(_STARTED)
        .cte("started"),
    )
    .order_by(_CLAIMABLE.c.id)
)
TASKS_HELD = select(TASKS.c.id).where(
    TASKS.c.id.in_(_IDS),
    TASKS.c.status == bindparam("running"),
    TASKS.c.lease_owner == bindparam("owner"),
)
# the model's lease and version, and how many of the tasks `ids` are still ours: one read
LEASE = select(
    MODELS.c.lease_owner,
    MODELS.c.current_version_id,
    select(func.count()).select_from(TASKS_HELD.subquery()).scalar_subquery().label("tasks_held"),
).where(MODELS.c.id == bindparam("model_id"))

# a finished task, one row each (executemany); `_AS_BEFORE` when its samples were removed
# by an earlier certificate (no version of this update)
_FINISHED = {
    "status": bindparam("done"),
    "error": null(),  # a wait for storage, or an earlier attempt's failure, is over
    "n_removed": bindparam("removed"),
    "certificate_id": bindparam("certificate"),
    "lease_owner": null(),
    "lease_expires_at": null(),
    "updated_at": bindparam("now"),
}
FINISH_TASK = (
    update(TASKS)
    .where(TASKS.c.id == bindparam("task_id"))
    .values(**_FINISHED, version_id=bindparam("version"))
)
FINISH_TASK_AS_BEFORE = update(TASKS).where(TASKS.c.id == bindparam("task_id")).values(**_FINISHED)
REMOVE_SAMPLE = (
    update(MODEL_SAMPLES)
    .where(
        MODEL_SAMPLES.c.model_id == bindparam("model"),
        MODEL_SAMPLES.c.sample_id == bindparam("sample"),
    )
    .values(
        removed_version_id=bindparam("version"), removed_certificate_id=bindparam("certificate")
    )
)
MAKE_CURRENT = (
    update(MODELS)
    .where(MODELS.c.id == bindparam("model_id"))
    .values(current_version_id=bindparam("version"), updated_at=bindparam("now"))
)
# (parameters not named after a column: in PURGE_AT_ONCE an UPDATE would SET such a column)
OLDER_VERSIONS = select(VERSIONS.c.id, VERSIONS.c.weights_key, VERSIONS.c.state_key).where(
    VERSIONS.c.model_id == bindparam("model"),
    VERSIONS.c.id != bindparam("keep"),
    VERSIONS.c.erased_at.is_(None),
)
ERASE_VERSIONS = (
    update(VERSIONS)
    .where(VERSIONS.c.id.in_(_IDS))
    .values(weights_key=null(), state_key=null(), erased_at=bindparam("now"))
)
# PostgreSQL: the two above and the blobs' rows' deletion (Blobs.retire's) in one statement,
# the deleted blobs' (key, key_id, location) returned: two round trips less per commit
_OLDER = OLDER_VERSIONS.cte("older")
PURGE_AT_ONCE = (
    delete(BLOBS)
    .where(
        BLOBS.c.key.in_(
            union_all(select(_OLDER.c.weights_key), select(_OLDER.c.state_key)).scalar_subquery()
        )
    )
    .add_cte(
        update(VERSIONS)
        .where(VERSIONS.c.id.in_(select(_OLDER.c.id)))
        .values(weights_key=null(), state_key=null(), erased_at=bindparam("now"))
        .cte("erased")
    )
    .returning(BLOBS.c.key, BLOBS.c.key_id, BLOBS.c.location)
)
REQUESTS_WITH_TASKS = (
    select(
        REQUESTS.c.id,
        REQUESTS.c.status,
        REQUESTS.c.finished_at,
        REQUESTS.c.commitment_key_id,
        REQUESTS.c.sample_ids,
        TASKS.c.status.label("task_status"),
    )
    .join(TASKS, TASKS.c.request_id == REQUESTS.c.id)
    .where(REQUESTS.c.id.in_(_IDS))
)
FINISH_REQUEST = (
    update(REQUESTS)
    .where(REQUESTS.c.id == bindparam("request_id"))
    .values(
        status=bindparam("outcome"),
        finished_at=bindparam("finished"),
        commitment_key_id=bindparam("key"),
        updated_at=bindparam("now"),
    )
)


# ---- the load ----------------------------------------------------------------------------


def _left(status: str) -> Any:
    return (
        select(func.count())
        .where(
            SAMPLES.c.dataset_id == bindparam("dataset_id"),
            SAMPLES.c.split == "test",
            SAMPLES.c.status == bindparam(status),
        )
        .scalar_subquery()
    )


# test rows that left the split: one count per status, each an equality on all three columns
# of ix_samples_dataset_split_status (see load.test_rows_left)
TEST_ROWS_LEFT = select(_left("erasing") + _left("erased"))
HELD = select(MODEL_SAMPLES.c.sample_id).where(
    MODEL_SAMPLES.c.model_id == bindparam("model_id"),
    MODEL_SAMPLES.c.removed_version_id.is_(None),
    MODEL_SAMPLES.c.sample_id.in_(_IDS),
)
# The requests' commitment openings, wrapped: joined to `short_keys`, which is not
# partitioned. (When they lived in the hash-partitioned `data_keys`, a join made PostgreSQL
# plan against all 128 partitions on every deletion, so they were read by id; migration
# 0018 moved them, and the join is a round trip less per load.)
OPENINGS = (
    select(REQUESTS.c.id, SHORT_KEYS.c.wrapped)
    .join(SHORT_KEYS, SHORT_KEYS.c.id == REQUESTS.c.commitment_key_id)
    .where(REQUESTS.c.id.in_(_IDS))
)
