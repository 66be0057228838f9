"""Resident model sessions: an update reuses what the previous
one left in the worker's memory, reads only what its requests name, rebuilds when another
worker moved the model on, and drops the removed rows with the commit."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from sqlalchemy import select

from app.core.db.session import database
from app.core.db.tables import Model, Sample
from app.core.ledger.certificates import lineage_history
from app.core.settings import Settings
from app.core.states import SampleStatus
from tests.conftest import SMALL_TRAINING, Api, train_ids
from tests.support.factories import forget
from workers import training
from workers.context import JobContext
from workers.data import Arrays, database_key
from workers.resident import ModelSession, Sessions


@pytest.fixture
def two_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Sessions, Sessions]]:
    """Two workers' session caches; the test says which one the (inline) worker uses."""
    first, second = Sessions(4), Sessions(4)
    monkeypatch.setattr(JobContext, "resident_sessions", lambda self: _active[0])
    _active[:] = [first]
    yield first, second


_active: list[Sessions] = []


def use(sessions: Sessions) -> None:
    _active[:] = [sessions]


def create(api: Api, dataset_id: int, name: str, method: dict | None = None) -> dict:
    """A logreg model under `method` (retrain by default), trained and ready."""
    body = {
        "name": name,
        "dataset_id": dataset_id,
        "architecture": {"type": "logreg"},
        "training": SMALL_TRAINING,
        "method": method or {"name": "retrain"},
        "privacy": {"max_relative_noise": None},  # every release the method's, however noisy
    }
    response = api.post("/v1/models", json=body)
    assert response.status_code == 202, response.text
    model = api.wait(f"/v1/models/{response.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def current(api: Api, model_id: int) -> dict:
    return api.get(f"/v1/models/{model_id}").json()["current_version"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the worker's memory, not storage
def test_a_session_is_reused_rebuilt_when_moved_on_and_equals_a_cold_update(
    api: Api, digits: dict, settings: Settings, two_workers: tuple[Sessions, Sessions]
) -> None:
    a, b = two_workers
    warm = create(api, digits["id"], "warm")  # trained by worker a: its session is seeded
    n = warm["current_version"]["n_train"]
    # The session holds the training rows now: the opened-samples cache keeps only the test
    # split's (goal 6: no second copy of the data in the worker's memory).
    here = (database_key(database(api.url).engine), digits["id"])  # other tests' are there too
    opened = [b for w, b in api.worker().opened._blocks.items() if w[:2] == here]
    assert opened and all(set(b.ids.tolist()) == _test_ids(api, digits["id"]) for b in opened)
    cold = create(api, digits["id"], "cold")
    ids = train_ids(api, digits["id"], 4)
    where = settings.resolved_database_url

    def cold_only() -> None:  # the second model never keeps a session
        a.drop(where, cold["id"])
        b.drop(where, cold["id"])

    # 1. Worker a, warm from training: the update reads no training row.
    cold_only()
    forget(api, digits["id"], ids[:1])
    v2 = current(api, warm["id"])
    assert v2["metrics"]["rows_loaded"] == 0 and v2["n_train"] == n - 1
    assert current(api, cold["id"])["metrics"]["rows_loaded"] == n
    # 2. Worker b has never seen the model: it reads every retained row, then keeps them.
    use(b)
    cold_only()
    forget(api, digits["id"], ids[1:2])
    assert current(api, warm["id"])["metrics"]["rows_loaded"] == n - 1
    # 3. Back to worker a: its session is at v2, the model at v3, so it rebuilds.
    use(a)
    cold_only()
    forget(api, digits["id"], ids[2:3])
    v4 = current(api, warm["id"])
    assert v4["metrics"]["rows_loaded"] == n - 2 and v4["number"] == 4
    # 4. And now it is warm again.
    cold_only()
    forget(api, digits["id"], ids[3:4])
    v5 = current(api, warm["id"])
    assert v5["metrics"]["rows_loaded"] == 0 and v5["n_train"] == n - 4
    # Warm or cold, the exact retrain is the same model, bit for bit (the files differ only
    # in their metadata: model id, parent).
    warm_state, cold_state = weights(api, warm["id"]), weights(api, cold["id"])
    assert warm_state.keys() == cold_state.keys()
    assert all(torch.equal(warm_state[k], cold_state[k]) for k in warm_state)
    # The removed rows left worker a's memory with the commit.
    session = _settled(a, where, warm["id"], _version_id(api, warm["id"]))
    assert session is not None and len(session) == n - 4
    removed = _erased(api, digits["id"])
    assert removed and not removed & set(session.held_ids().tolist())
    dead = ~session.alive  # rows still in the arrays are overwritten: no plaintext is left
    assert not session.X[torch.from_numpy(dead)].any()
    assert all(e == "" for e in session.external_ids[dead])


def weights(api: Api, model_id: int) -> dict[str, torch.Tensor]:
    response = api.get(f"/v1/models/{model_id}/weights", role="reader")
    assert response.status_code == 200, response.text
    return dict(st_load(response.content))


def _erased(api: Api, dataset_id: int) -> set[int]:
    with database(api.url).read() as session:
        return set(
            session.scalars(
                select(Sample.id).where(
                    Sample.dataset_id == dataset_id, Sample.status == SampleStatus.erased
                )
            )
        )


def _test_ids(api: Api, dataset_id: int) -> set[int]:
    with database(api.url).read() as session:
        return set(
            session.scalars(
                select(Sample.id).where(Sample.dataset_id == dataset_id, Sample.split == "test")
            )
        )


def _settled(sessions: Sessions, where: str, model_id: int, version_id: int) -> ModelSession:
    """The model's session at `version_id`, once the worker has kept it: a request's long
    poll wakes when its update commits, a moment before the worker moves its session on."""
    deadline = time.monotonic() + 10
    while (session := sessions.peek(where, model_id)) is None or session.version_id != version_id:
        assert time.monotonic() < deadline, "the worker kept no session at the current version"
        time.sleep(0.01)
    return session


def _version_id(api: Api, model_id: int) -> int:
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        assert model is not None and model.current_version_id is not None
        return model.current_version_id


def session_of(n: int, device: torch.device = torch.device("cpu")) -> ModelSession:
    ids = list(range(10, 10 + 2 * n, 2))  # ascending, with gaps
    rows = Arrays(
        ids,
        [f"e{i}" for i in ids],
        torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
        torch.arange(n) % 2,
        [None] * n,
    )
    test = Arrays([], [], torch.zeros((0, 3)), torch.zeros(0, dtype=torch.long), [])
    return ModelSession.of(1, 7, rows, {"w": torch.ones(3)}, test, device)


def test_split_and_advance_use_index_arrays_and_refuse_unheld_ids() -> None:
    s = session_of(6)
    removed, retained = s.split([14, 20], {}, [])
    assert removed.sample_ids == [14, 20] and removed.X[:, 0].tolist() == [6.0, 15.0]
    assert retained.sample_ids == [10, 12, 16, 18] and retained.external_ids[0] == "e10"
    assert torch.equal(retained.X, s.X[[0, 1, 3, 4]])
    after = s.advance(8, [14, 20], {"w": torch.zeros(3)})
    assert after.version_id == 8 and after.sample_ids.tolist() == [10, 12, 16, 18]
    assert np.array_equal(after.X.numpy(), retained.X.numpy())
    for missing in ([11], [10, 99], [8]):
        with pytest.raises(LookupError):
            s.rows_of(missing)


def test_one_removal_marks_and_overwrites_its_row_and_copies_nothing_else() -> None:
    s = session_of(12)
    removed, retained = s.split([14], {}, [])
    assert len(retained) == 11 and retained._rows is None  # nothing drawn yet
    first = retained.head(2)[0]
    assert torch.equal(first, s.X[[0, 1]])
    blocks = list(retained.blocks(5))
    assert [len(b[1]) for b in blocks] == [5, 5, 1]  # cut as the retained set's own arrays
    assert torch.equal(torch.cat([b[0] for b in blocks]), retained.X)  # the dead row left out
    assert blocks[1][0].data_ptr() != s.X[5:10].data_ptr()  # it spans the dead row: a copy
    assert blocks[2][0].data_ptr() == s.X[11:12].data_ptr()  # consecutive rows: a view
    kept_before = retained.X.clone()
    after = s.advance(8, [14], {"w": torch.zeros(3)})
    assert after.X.data_ptr() == s.X.data_ptr()  # no copy below a quarter of dead rows
    assert after.held_ids().tolist() == retained.sample_ids and len(after) == 11
    assert not after.X[2].any() and after.external_ids[2] == "" and after.subjects[2] is None
    assert torch.equal(kept_before, retained.X)  # what the update read is unchanged
    with pytest.raises(LookupError):
        after.rows_of([14])  # a removed id is no longer held
    later = after.advance(9, [10, 12], {"w": torch.zeros(3)})  # 3 of 12: compacted
    assert len(later.sample_ids) == 9 and later.alive.all()
    assert later.held_ids().tolist() == [16 + 2 * i for i in range(9)]


def test_a_session_on_the_workers_device_draws_its_rows_there() -> None:
    """A GPU worker keeps its sessions' rows on its device (LETHE_DEVICE): moving an update's
    inputs there copies nothing, and removal, blocks and compaction index on that device.
    `meta` stands in for the GPU (a CPU index or a CPU copy on the way fails the test)."""
    meta = torch.device("meta")
    s = session_of(12, meta)
    assert s.X.device == meta and s.test.X.device == meta
    removed, retained = s.split([14], {}, [])
    assert removed.X.device == meta and retained.to(meta) is retained  # still deferred
    assert retained._rows is None
    assert all(X.device == meta for X, _ in retained.blocks(5))
    assert retained.head(2)[0].device == meta
    assert retained.take(torch.tensor([0, 3]))[0].shape == (2, 3)
    after = s.advance(8, [14], {"w": torch.zeros(3)})
    later = after.advance(9, [10, 12], {"w": torch.zeros(3)})  # compacted on the device
    assert later.X.device == meta and later.X.shape == (9, 3)
    on_cpu = session_of(12)
    _, kept = on_cpu.split([14], {}, [])
    assert kept.to(torch.device("cpu")) is kept


def test_sessions_hand_out_only_the_current_version_and_keep_the_most_recent() -> None:
    held = Sessions(2)
    for model in (1, 2, 3):
        held.put("db", ModelSession(**{**session_of(2).__dict__, "model_id": model}))
    assert held.take("db", 1, 7) is None  # least recently used, gone
    assert held.take("db", 2, 8) is None  # another version: dropped
    assert held.take("db", 2, 7) is None and held.take("db", 3, 7) is not None
    off = Sessions(0)  # LETHE_RESIDENT_MODELS=0: nothing is kept
    off.put("db", session_of(2))
    assert off.take("db", 1, 7) is None and len(off) == 0


def test_the_opened_samples_block_merges_drops_and_takes_with_index_arrays() -> None:
    """workers/data.py's cache of opened samples (issue 28: no Python loop over the samples)."""
    from workers.data import _Block

    def rows(ids: list[int]) -> Arrays:
        X = torch.tensor([[float(i)] for i in ids])
        return Arrays(ids, [f"e{i}" for i in ids], X, torch.tensor(ids) % 3, [f"s{i}" for i in ids])

    block = _Block.empty([1]).merge(rows([2, 5, 9]))
    assert block.missing([9, 1, 5, 7, 7]) == [1, 7]
    block = block.merge(rows([1, 7, 10]))  # interleaved ids: kept in ascending order
    assert block.ids.tolist() == [1, 2, 5, 7, 9, 10]
    assert block.X[:, 0].tolist() == [1.0, 2.0, 5.0, 7.0, 9.0, 10.0]  # every array merged alike
    assert block.y.tolist() == [1, 2, 2, 1, 0, 1]
    assert block.external_ids.tolist() == ["e1", "e2", "e5", "e7", "e9", "e10"]
    assert block.subjects.tolist() == ["s1", "s2", "s5", "s7", "s9", "s10"]
    taken = block.take([9, 1, 7])  # any order in, the same order out
    assert taken.sample_ids == [9, 1, 7] and taken.external_ids == ["e9", "e1", "e7"]
    assert taken.X[:, 0].tolist() == [9.0, 1.0, 7.0] and taken.subjects == ["s9", "s1", "s7"]
    # the whole block in order: the block's own rows when the caller may share them, else a copy
    assert block.take(block.ids.tolist(), copy=False).X is block.X
    whole = block.take(block.ids.tolist())
    assert whole.X.data_ptr() != block.X.data_ptr() and torch.equal(whole.X, block.X)
    assert block.take([1, 2], copy=False).X.data_ptr() != block.X.data_ptr()  # a part: copied
    dropped = block.drop(np.array([5, 99]))
    assert dropped.ids.tolist() == [1, 2, 7, 9, 10] and block.drop(np.array([], int)) is block
    with pytest.raises(RuntimeError, match=r"\[5\]"):
        dropped.take([1, 5])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_session_keeps_the_lineage_a_fresh_read_of_the_log_gives(
    api: Api, digits: dict, settings: Settings, two_workers: tuple[Sessions, Sessions]
) -> None:
    """The lineage an update admits against is carried in the session and extended by each
    commit (issue 28: reading it decoded one certificate per version, a cost that grew with
    every release); after noisy releases and an exact retrain it equals the log's."""
    a, _ = two_workers
    noisy = {"name": "output_perturbation", "C0": 1.0, "finetune_epochs": 0}
    model = create(api, digits["id"], "noisy", noisy)
    ids = train_ids(api, digits["id"], 4)
    where = settings.resolved_database_url
    lengths = []
    for i, method in enumerate([None, None, "retrain", None]):
        forget(api, digits["id"], ids[i : i + 1], method=method)
        session = _settled(a, where, model["id"], _version_id(api, model["id"]))
        assert session is not None and session.history is not None
        with database(api.url).read() as db:
            assert list(session.history) == lineage_history(db, model["id"])
        lengths.append(len(session.history))
    assert lengths == [1, 2, 0, 1]  # two noisy releases, an exact retrain resets, one more


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the worker's memory, not storage
def test_the_session_keeps_the_training_record_a_fresh_read_gives(
    api: Api,
    digits: dict,
    settings: Settings,
    two_workers: tuple[Sessions, Sessions],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recording method's training record and the samples removed since are carried in the
    session (issue 28: reading them decoded every version's metrics, a cost that grew with
    every release): read once by a worker new to the model, then kept by each commit, equal
    to a fresh read after every update, a retrain (which records anew) included. recollection
    keeps its record's batch schedule resident too (methods/recollection/replay.py: replaying
    it walked all n samples per update, 14–22 ms at 100,000): made by the first update,
    reused by the next, made again after the retrain."""
    from methods.recollection import compute
    from methods.recollection.replay import Replay
    from workers import load

    _, b = two_workers
    reads: list[int] = []
    real = load.training_record

    def counted(session, model_id):  # type: ignore[no-untyped-def]
        reads.append(model_id)
        return real(session, model_id)

    replays: list[int] = []
    replay = Replay.of

    def replayed(source):  # type: ignore[no-untyped-def]
        replays.append(len(source["train_sample_ids"]))
        return replay(source)

    monkeypatch.setattr(load, "training_record", counted)
    monkeypatch.setattr(compute.Replay, "of", staticmethod(replayed))
    recording = {"name": "recollection", "max_relative_noise": None, "rho_checks": 1}
    model = create(api, digits["id"], "recorded", recording)
    use(b)  # a worker that never saw the model
    ids = train_ids(api, digits["id"], 5)
    where = settings.resolved_database_url
    kept: list[int] = []
    for i, method in enumerate([None, None, "retrain", None, None]):
        forget(api, digits["id"], ids[i : i + 1], method=method)
        session = _settled(b, where, model["id"], _version_id(api, model["id"]))
        assert session.record is not None
        with database(api.url).read() as db:
            record, since = real(db, model["id"])
        assert record is not None and session.record.record == record
        assert session.record.removed_since.tolist() == since.tolist()
        kept.append(len(since))
        if method is None:  # the schedule of the session's own record
            assert isinstance(session.method_state, Replay)
            assert session.method_state.made_from(session.record.record)
    assert kept == [1, 2, 0, 1, 2]  # the retrain recorded anew; nothing removed since
    assert reads == [model["id"]]  # one read, by the first update of worker b
    assert len(replays) == 2  # the first update, and the first after the retrain


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_test_split_is_read_once_per_session_not_again_on_its_next_update(
    api: Api,
    digits: dict,
    two_workers: tuple[Sessions, Sessions],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A session is dated by the count of test rows gone when its split was read (issue 28,
    goal 6: a session seeded by training, or made cold, re-read the whole split on its next
    update; 4 s of a million-row model's first deletion)."""
    from workers import load

    _, b = two_workers
    reads: list[int] = []
    real = load.test_arrays

    def counted(session, opened, dataset):  # type: ignore[no-untyped-def]
        reads.append(dataset.id)
        return real(session, opened, dataset)

    monkeypatch.setattr(load, "test_arrays", counted)
    model = create(api, digits["id"], "dated")  # worker a seeds the session from training
    ids = train_ids(api, digits["id"], 4)
    forget(api, digits["id"], ids[:1])
    forget(api, digits["id"], ids[1:2])
    assert reads == []  # warm from training: the split it read is current
    use(b)  # a worker that never saw the model: one cold read, then none
    forget(api, digits["id"], ids[2:3])
    forget(api, digits["id"], ids[3:4])
    assert reads == [digits["id"]]
    assert current(api, model["id"])["n_train"] == model["current_version"]["n_train"] - 4


def test_accuracies_are_taken_on_a_fixed_head_of_the_test_split(
    api: Api, digits: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test accuracy of a trained and of an unlearned version is on the same first
    ACCURACY_ROWS test rows: an update's metrics do not grow with the test split."""
    from workers import updates

    monkeypatch.setattr(updates, "ACCURACY_ROWS", 50)
    monkeypatch.setattr(training, "ACCURACY_ROWS", 50)
    model = create(api, digits["id"], "head")
    forget(api, digits["id"], train_ids(api, digits["id"], 1))
    versions = api.get(f"/v1/models/{model['id']}/versions").json()
    assert [v["number"] for v in versions] == [1, 2]
    for v in versions:
        m = v["metrics"]
        assert m["n_test"] > 50 and m["test_accuracy_rows"] == 50
        correct = m["test_accuracy"] * 50  # a count of 50 rows, through a float32 mean
        assert abs(correct - round(correct)) < 1e-4, correct
