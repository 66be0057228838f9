"""Traces: with an OTLP endpoint configured, one deletion is one trace from
its POST to its certificate, across the API process, the queue and the worker, whether the
worker is the embedded one's child process or a distributed `lethe worker`; its steps'
durations add up to the POST→certificate time; no span carries a sample's or a subject's id.
Spans go by OTLP/HTTP to a receiver in the test (tests/support/otlp_receiver.py)."""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import truncate_all
from tests.support.cluster import Cluster
from tests.support.otlp_receiver import OtlpReceiver, Span
from tests.support.servers import free_port

pytestmark = pytest.mark.integration

# the steps of a deletion, in order: they tile its path from POST to certificate (the group
# commit until the request's write, the queue wait from there; the journal write, after the
# commit, runs beside the worker's start: in the trace, off that path)
STEPS = (
    "deletion.validate",
    "deletion.group_commit",
    "deletion.queue_wait",
    "deletion.load",
    "deletion.compute",
    "deletion.commit",
    "deletion.publication",
)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver(free_port())
    r.start()
    yield r
    r.stop()


def traced(cluster: Cluster, receiver: OtlpReceiver) -> None:
    cluster.env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export every 100 ms, not every 5 s
        }
    )


def people_npz() -> tuple[bytes, list[str], list[str]]:
    """600 rows of 5 people each, ids and subjects that no span may carry."""
    rng = np.random.default_rng(7)
    ids = [f"sample-{i:04d}-{rng.integers(1 << 30):x}" for i in range(600)]
    subjects = [f"person-{i // 5:03d}-q" for i in range(600)]
    buf = io.BytesIO()
    y = rng.integers(0, 3, size=600)
    X = rng.normal(size=(600, 20)) + y[:, None]
    np.savez(buf, X=X, y=y, ids=np.array(ids), subjects=np.array(subjects))
    return buf.getvalue(), ids, subjects


def one_deletion(
    cluster: Cluster, receiver: OtlpReceiver
) -> tuple[list[Span], list[Span], list[str]]:
    """Train a model, delete one person's rows; the spans of the deletion's trace, every span
    received, and the ids the deletion named (its person's, and their rows')."""
    data, ids, subjects = people_npz()
    with cluster.client() as c:
        made = c.post("/v1/datasets", files={"file": ("people.npz", data)})
        assert made.status_code == 201, made.text
        dataset = made.json()["id"]
        model = c.post(
            "/v1/models",
            json={"name": "traced", "dataset_id": dataset, "training": {"epochs": 2}},
        ).json()["id"]
        while c.get(f"/v1/models/{model}").json()["status"] != "ready":  # trained: seconds
            time.sleep(0.2)
        person = subjects[10]
        rows = c.get(f"/v1/datasets/{dataset}/samples", params={"subject": person}).json()
        named = [person] + [r["external_id"] for r in rows["items"]]
        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": dataset, "subject_ids": [person]},
            headers={"Prefer": "wait=60"},
        ).json()
        assert answer["status"] == "done", answer

    def whole(spans: list[Span]) -> list[Span] | None:
        posts = [s for s in spans if s.name == "deletion.validate"]
        if not posts:
            return None
        trace = [s for s in spans if s.trace_id == posts[-1].trace_id]
        names = {s.name for s in trace}
        rooted = any(s.parent_id == "" for s in trace)  # the POST's span ends last
        return (
            trace
            if rooted and set(STEPS) | {"deletion.journal", "deletion.store"} <= names
            else None
        )

    trace = receiver.wait_for("the deletion's whole trace", whole)
    return trace, list(receiver.spans), named


def check_trace(trace: list[Span], everything: list[Span], named: list[str]) -> None:
    services = {s.service for s in trace}
    assert services == {"lethe-api", "lethe-worker"}, services
    (post,) = [s for s in trace if s.parent_id == ""]  # one root: the POST's server span
    assert post.service == "lethe-api" and post.name.startswith("POST /v1/deletions"), post
    steps = {name: [s for s in trace if s.name == name] for name in STEPS}
    assert all(len(v) == 1 for v in steps.values()), {k: len(v) for k, v in steps.items()}
    first = {k: v[0] for k, v in steps.items()}
    # the worker's steps hang under the update, the update and the queue wait under the POST
    update = next(s for s in trace if s.name == "deletion.update")
    for name in ("deletion.load", "deletion.compute", "deletion.commit", "deletion.publication"):
        assert first[name].parent_id == update.span_id and first[name].service == "lethe-worker"
    assert (
        update.parent_id == post.span_id and first["deletion.queue_wait"].parent_id == post.span_id
    )
    store = [s for s in trace if s.name == "deletion.store"]
    assert store and store[0].parent_id == first["deletion.compute"].span_id
    # in order, and adding up to the POST→certificate time within 10 %
    starts = [first[name].start_ns for name in STEPS]
    assert starts == sorted(starts), [(n, first[n].start_ns) for n in STEPS]
    total = (first["deletion.publication"].end_ns - post.start_ns) / 1e9
    summed = sum(first[name].seconds for name in STEPS)
    # no time counted twice, and the steps cover the path: the POST's arrival to the
    # certificate's publication, within 10 % either way
    shares = {n: first[n].seconds for n in STEPS}
    pairs = itertools.pairwise(STEPS)
    gaps = {f"{a}→{b}": (first[b].start_ns - first[a].end_ns) / 1e9 for a, b in pairs}
    gaps["POST→validate"] = (first[STEPS[0]].start_ns - post.start_ns) / 1e9
    assert 0.9 * total <= summed <= 1.1 * total, (summed, total, shares, gaps)
    # no span attribute, of any trace, carries an id the deletion named (a GET with
    # ?subject= was traced too: its URL lost the query)
    for s in everything:
        text = " ".join(str(v) for v in s.attributes.values())
        assert not any(i in text for i in named), (s.name, s.attributes)
    sql = [s for s in trace if "db.statement" in s.attributes]
    assert sql, "the SQLAlchemy instrumentation's spans are in the trace"


def test_one_deletion_is_one_trace_across_the_embedded_worker_process(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    with Cluster(tmp_path / "data", None, None) as cluster:
        traced(cluster, receiver)
        cluster.start_api()
        trace, everything, named = one_deletion(cluster, receiver)
    check_trace(trace, everything, named)


@pytest.mark.long
def test_one_deletion_is_one_trace_across_a_distributed_worker(
    tmp_path: Path, receiver: OtlpReceiver, pg_url: str, redis_url: str
) -> None:
    truncate_all(pg_url)
    with Cluster(tmp_path / "data", pg_url, redis_url) as cluster:
        traced(cluster, receiver)
        cluster.start_api()
        cluster.start_worker()
        trace, everything, named = one_deletion(cluster, receiver)
    check_trace(trace, everything, named)
