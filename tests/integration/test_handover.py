"""A worker that gives way after an erasure hands its successor the resident method states it
held (workers/handover.py): convex_head's anchored state survives the trip bit for bit, is
taken only for the state and rows it describes, and the next removal from it is the one the
predecessor would have made; anything that does not parse is ignored."""

from __future__ import annotations

import os
import signal
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from redis import Redis

from app.core.db.session import database
from app.core.db.tables import Model
from methods.compute import PrivacyTarget
from methods.convex_head import removal
from methods.convex_head.compute import ConvexHead, to_theta
from tests.conftest import Api, truncate_all
from tests.conftest import train_ids as train_ids_of
from tests.integration.test_pipeline_distributed import FAST, ready_model, train_ids, wait_until
from tests.support.cluster import Cluster
from tests.support.factories import forget, model_spec, update_inputs
from tests.support.servers import free_port
from workers import handover, tensorfile
from workers.data import Arrays, database_key
from workers.metrics import RESIDENT_STATES_HANDED_OVER
from workers.resident import HandedState, ModelSession, Sessions

R, LAM, CLASSES = 6.0, 1e-2, 3


def trained_session() -> tuple[ConvexHead, ModelSession, removal.Resident]:
    rng = np.random.default_rng(3)
    X = torch.tensor(rng.normal(size=(1500, 10)), dtype=torch.float32)
    y = torch.tensor((X[:, :CLASSES].numpy() + rng.normal(size=(1500, CLASSES))).argmax(1))
    spec = model_spec(
        {"type": "logreg", "feature_norm": R},
        {"name": "convex_head", "lam": LAM, "R": R, "beta": 0.05},
        10,
        CLASSES,
    )
    head = ConvexHead(spec)
    ids = list(range(1500))
    arrays = Arrays(ids, [str(i) for i in ids], X, y, [None] * 1500)
    _, whole = ModelSession.of(0, 1, arrays, {}, arrays).split([], {}, [])
    session = ModelSession.of(0, 1, arrays, dict(head.train(whole).state), arrays)
    _, retained = session.split([], {}, [])
    resident = head.prepare(retained, dict(session.state))
    return head, session, resident


def through_the_pipe(head: ConvexHead, resident: removal.Resident) -> HandedState:
    """What a successor receives: the exported tensors in one buffer, parsed back."""
    tensors = head.export_resident(resident)
    assert tensors is not None
    named = {f"7/{name}": t for name, t in tensors.items()}
    data = tensorfile.encode_bytes(named, {"versions": '{"7": 41}'})
    (only,) = handover.parsed(data).items()
    assert only[0] == 7
    return only[1]


def test_a_handed_over_convex_head_state_is_the_one_exported() -> None:
    head, session, resident = trained_session()
    handed = through_the_pipe(head, resident)
    assert handed.version_id == 41
    _, retained = session.split([], {}, [])
    taken = head.import_resident(handed.tensors, retained, dict(session.state))
    assert isinstance(taken, removal.Resident)
    for field in fields(removal.Resident):
        mine, theirs = getattr(resident, field.name), getattr(taken, field.name)
        if field.name == "rows":  # read again by the successor from its own rows
            assert theirs is not None and mine is not None
            assert torch.equal(mine.Z, theirs.Z) and torch.equal(mine.ids, theirs.ids)
        elif field.name == "anchor":
            for part in fields(removal.Anchor):
                a, b = getattr(mine, part.name), getattr(theirs, part.name)
                assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, part.name
        elif isinstance(mine, torch.Tensor):
            assert torch.equal(mine, theirs), field.name
        else:
            assert mine == theirs, field.name
    # the next removal from the handed-over state is the predecessor's, bit for bit
    removed, retained = session.split([4, 900], {}, [])
    inputs = update_inputs(
        head.model, dict(session.state), removed, retained, target=PrivacyTarget(1.0, 1e-5)
    )
    theirs = head.unlearn(replace(inputs, resident=taken))
    mine = head.unlearn(replace(inputs, resident=resident))
    assert theirs.metrics["hessian_passes"] == mine.metrics["hessian_passes"] == 0
    assert torch.equal(to_theta(theirs.next_state), to_theta(mine.next_state))
    assert theirs.certificate.constants["s"].value == mine.certificate.constants["s"].value


def test_a_handed_over_state_is_refused_for_another_state_or_other_rows() -> None:
    head, session, resident = trained_session()
    handed = through_the_pipe(head, resident)
    _, retained = session.split([], {}, [])
    moved = {k: v + 1e-9 for k, v in session.state.items()}
    assert head.import_resident(handed.tensors, retained, moved) is None
    _, fewer = session.split([0], {}, [])
    assert head.import_resident(handed.tensors, fewer, dict(session.state)) is None
    assert head.import_resident({"theta": to_theta(session.state)}, retained, session.state) is None


@pytest.mark.parametrize("data", [None, b"", b"not safetensors", b"\xff" * 8 + b"{}"])
def test_what_does_not_parse_hands_over_nothing(data: bytes | None) -> None:
    assert handover.parsed(data) == {}


def test_a_handed_over_state_is_taken_once() -> None:
    sessions = Sessions(2)
    state = HandedState(3, {"m": torch.tensor(1)})
    sessions.hand_in("db", {5: state})
    assert sessions.handed("other", 5) is None
    assert sessions.handed("db", 5) is state
    assert sessions.handed("db", 5) is None


def test_the_memory_file_carries_the_buffer_across() -> None:
    fd = handover.to_memory_file(b"abc" * 1000)
    assert fd is not None
    environ = {handover.FD_ENV: str(fd)}
    assert handover.from_memory_file(environ) == b"abc" * 1000
    assert handover.FD_ENV not in environ
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once read


@pytest.mark.integration
def test_lethe_worker_hands_its_states_across_its_re_execution(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """`lethe worker` gives way after an erasure by re-executing itself: the convex_head
    model's anchored state crosses in a memory file, and the same process image's warm-up
    takes it instead of preparing anew (its own metrics say so)."""
    truncate_all(pg_url)
    port = free_port()
    cluster = Cluster(
        tmp_path / "c",
        pg_url,
        redis_url,
        **FAST,
        plaintext_ttl_seconds=4,
        worker_metrics_port=port,
    )
    cluster.start_api()
    try:
        with cluster.client() as c:
            worker = cluster.start_worker()
            method = {"name": "convex_head", "lam": 1e-2, "R": 20.0}
            ds, model = ready_model(c, method=method, architecture={"type": "logreg"})
            (sample,) = train_ids(c, ds["id"], 1)
            answer = c.post(
                "/v1/deletions",
                json={"dataset_id": ds["id"], "sample_ids": [sample]},
                headers={"Prefer": "wait=60"},
            )
            assert answer.json()["status"] == "done", answer.text
            log = cluster.data_dir / "worker-0.log"
            wait_until(lambda: "gives way after an erasure" in log.read_text())

            def handed() -> bool:
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
                except httpx.HTTPError:  # the new image has not bound the port yet
                    return False
                return "lethe_resident_states_handed_over_total 1.0" in text

            wait_until(handed)
            assert worker.poll() is None  # the same process, re-executed
            assert "handed over" in log.read_text()
    finally:
        cluster.stop()
        Redis.from_url(redis_url).delete(f"rq:queue:{cluster.queue}")


@pytest.mark.integration
def test_lethe_worker_stopped_while_it_gives_way_exits(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A SIGTERM that comes while `lethe worker` hands over (its re-execution under way) is
    kept pending across it and taken by the new image: the worker exits 0. It used to be
    spent on the old image's handler, and a container's PID 1 then ran on, deaf to it."""
    truncate_all(pg_url)
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    cluster = Cluster(tmp_path / "c", pg_url, redis_url, **FAST, plaintext_ttl_seconds=4,
                      pause_dir=pauses, pause_at=["give-way"])  # fmt: skip
    cluster.start_api()
    try:
        with cluster.client() as c:
            worker = cluster.start_worker()
            ds, _ = ready_model(c)
            (sample,) = train_ids(c, ds["id"], 1)
            answer = c.post(
                "/v1/deletions",
                json={"dataset_id": ds["id"], "sample_ids": [sample]},
                headers={"Prefer": "wait=60"},
            )
            assert answer.json()["status"] == "done", answer.text
            wait_until(lambda: (pauses / "give-way-0.reached").exists())
            os.kill(worker.pid, signal.SIGTERM)  # the worker alone, not its group
            (pauses / "give-way-0.go").touch()
            assert worker.wait(timeout=120) == 0
            log = (cluster.data_dir / "worker-0.log").read_text()
            assert log.count("gives way after an erasure") == 1
    finally:
        cluster.stop()
        Redis.from_url(redis_url).delete(f"rq:queue:{cluster.queue}")


def kept_at_current(api: Api, ctx: Any, where: str, model_id: int) -> None:
    """Wait for the worker thread to keep the model's session at its current version: a
    deletion reads done once it commits, and its job keeps the session after that (under
    the full suite a test's `clear()` came first, and the session came back after it)."""
    with database(api.url).read() as session:
        current = session.get(Model, model_id).current_version_id

    def kept() -> bool:
        held = ctx.resident_sessions().peek(where, model_id)
        return held is not None and held.version_id == current

    wait_until(kept)


def test_a_deletion_before_the_warm_up_starts_from_the_handed_over_state(api: Api) -> None:
    """Deletions come before a successor's warm-up: one that finds no session reads the rows
    cold and takes the handed-over state instead of anchoring (a Hessian pass); a state of
    another version is refused and the update anchors as before."""
    from tests.service.test_convex_head import convex_model, current_metrics

    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = convex_model(api, ds["id"], beta=1.0)
    ids = train_ids_of(api, ds["id"], 3)
    forget(api, ds["id"], ids[:1])
    ctx = api.worker()
    where = database_key(ctx.db.engine)
    kept_at_current(api, ctx, where, model["id"])  # the session is resident now
    states = handover.parsed(handover.exported(ctx))
    assert list(states) == [model["id"]]
    before = RESIDENT_STATES_HANDED_OVER._value.get()

    ctx.resident_sessions().clear()  # as a successor starts: no session, the states handed in
    ctx.resident_sessions().hand_in(where, states)
    forget(api, ds["id"], ids[1:2])
    metrics = current_metrics(api, model["id"])
    assert metrics["hessian_passes"] == 0 and metrics["rows_loaded"] > 0, metrics
    assert RESIDENT_STATES_HANDED_OVER._value.get() == before + 1

    kept_at_current(api, ctx, where, model["id"])  # (else it came back after the clear)
    ctx.resident_sessions().clear()  # the state handed in is one version behind now
    ctx.resident_sessions().hand_in(where, states)
    forget(api, ds["id"], ids[2:])
    metrics = current_metrics(api, model["id"])
    assert metrics["hessian_passes"] == 1, metrics
    assert RESIDENT_STATES_HANDED_OVER._value.get() == before + 1
