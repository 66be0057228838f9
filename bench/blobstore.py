"""The blob store (issue 29), side by side in one run: put/get throughput and peak memory per
backend against a plain file copy of the same size, a 1 GiB weights download served by the
API (its RSS sampled), and minnorm's POST→certificate against its compute on each backend.

    .venv/bin/python -m bench.blobstore [--size-mib 1024] [--minnorm 5001,12000] [--deletions 2]

Each backend's put and get run in a fresh subprocess so that its peak RSS (ru_maxrss) is its
own. Writes bench/results/blobstore.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from app.client import Client
from app.db.session import dispose_engines
from bench import overparameterized_service
from bench.cluster import Cluster
from bench.common import scratch_database, write_result
from tests.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedServer

ROOT = Path(__file__).resolve().parents[1]

ROUND_TRIP = r"""
import json, os, resource, sys, time
import torch
from app.db.migrate import upgrade_to_head
from app.db.session import database
from app.settings import Settings
from app.storage.blobs import Blobs, object_store
from app.storage.crypto import Keyring
from workers import tensorfile

settings = Settings(**json.loads(sys.argv[1]))
size = int(sys.argv[2])
url = settings.resolved_database_url
upgrade_to_head(url)
db = database(url)
store = Blobs(object_store(settings, db), Keyring(os.urandom(32)), db, settings.blob_chunk_bytes)
state = {"gram_inverse": torch.rand(size // 8, dtype=torch.float64)}
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = peak()
t = time.perf_counter()
_, stream = tensorfile.encode(state)
written = store.write("bench/state", stream, digest=False)
put_s = time.perf_counter() - t
after_put = peak()
with db.write() as session:
    store.record(session, written)
t = time.perf_counter()
with db.read() as session:
    back = tensorfile.decode(store.read(session, written.key))
get_s = time.perf_counter() - t
after_get = peak()
same = bool(torch.equal(back["gram_inverse"], state["gram_inverse"]))
print(json.dumps({"put_s": put_s, "get_s": get_s, "base_rss": base, "put_peak_growth":
    after_put - base, "round_trip_peak_growth": after_get - base, "same": same}))
"""


def round_trip(settings: dict, size: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, json.dumps(settings), str(size)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    mib = size / 2**20
    seen["put_mib_per_s"] = mib / seen["put_s"]
    seen["get_mib_per_s"] = mib / seen["get_s"]
    return seen


def file_copy(folder: Path, size: int) -> dict:
    """The physical limit here: write a file of that size, copy it, read it into a buffer."""
    source, target = folder / "plain.bin", folder / "plain-copy.bin"
    block = os.urandom(1 << 20)
    t = time.perf_counter()
    with source.open("wb") as fh:
        for _ in range(size >> 20):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    shutil.copyfile(source, target)
    with target.open("rb+") as fh:
        os.fsync(fh.fileno())
    copy_s = time.perf_counter() - t
    t = time.perf_counter()
    buf = bytearray(size)
    with target.open("rb") as fh:
        fh.readinto(buf)
    read_s = time.perf_counter() - t
    source.unlink()
    target.unlink()
    mib = size / 2**20
    return {
        "write_fsync_s": write_s,
        "copy_fsync_s": copy_s,
        "read_s": read_s,
        "copy_mib_per_s": mib / copy_s,
        "read_mib_per_s": mib / read_s,
    }


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def download(folder: Path, size: int) -> dict:
    """A model whose released weights are `size` bytes (a real model's version row pointed at
    a large stored blob), downloaded from `lethe serve` while its RSS is sampled."""
    from sqlalchemy import update

    from app.db.session import database
    from app.db.tables import ModelVersion
    from app.settings import Settings
    from app.storage.blobs import blobs

    with Cluster(folder, None, None, weights_cache_bytes=0) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=600)
        ds = c.post("/v1/datasets", json={"builtin": "digits"})
        model = c.post(
            "/v1/models",
            json={"name": "big", "dataset_id": ds["id"], "architecture": {"type": "logreg"}},
        )
        c.wait_model(model["id"])
        settings = Settings(data_dir=folder)
        store = blobs(settings)
        block = memoryview(os.urandom(1 << 20))
        written = store.write(f"model-{model['id']}/weights", (block for _ in range(size >> 20)))
        db = database(settings.resolved_database_url)
        with db.write() as session:
            store.record(session, written)
            session.execute(
                update(ModelVersion)
                .where(ModelVersion.model_id == model["id"])
                .values(
                    weights_key=written.key,
                    weights_sha256=written.sha256,
                    weights_size=written.size,
                )
            )
        assert cluster.api is not None
        pid = cluster.api.pid
        before = rss_of(pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_of(pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        got, t = 0, time.perf_counter()
        headers = {"Authorization": f"Bearer {cluster.admin_key}"}
        with httpx.stream(
            "GET", f"{cluster.url}/v1/models/{model['id']}/weights", headers=headers, timeout=600
        ) as response:
            assert response.status_code == 200
            for piece in response.iter_bytes(1 << 20):
                got += len(piece)
        seconds = time.perf_counter() - t
        done.set()
        sampler.join()
        ranged = httpx.get(
            f"{cluster.url}/v1/models/{model['id']}/weights",
            headers={**headers, "Range": f"bytes={size // 2}-{size // 2 + 99}"},
        )
        assert ranged.status_code == 206 and len(ranged.content) == 100
    assert got == size
    return {
        "bytes": size,
        "seconds": seconds,
        "mib_per_s": size / 2**20 / seconds,
        "api_rss_before_mib": before / 2**20,
        "api_rss_peak_growth_mib": (peak[0] - before) / 2**20,
    }


def minnorm(folder: Path, n_train: int, deletions: int, settings: dict) -> dict:
    """minnorm (random features, p = 20,000) through the embedded service on one backend."""
    with Cluster(folder, None, None, max_dataset_cells=10**9, **settings) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=7200)
        got = overparameterized_service.run(c, int(n_train / 0.8) + 1, deletions)
    return {  # the names bench/results/blobstore.json has used
        "n_train": got["n_train"],
        "state_bytes": got["state_bytes"],
        "train_post_to_ready_s": got["train_seconds_post_to_ready"],
        "post_to_certificate_s": got["post_to_certificate_seconds"],
        "compute_s": got["unlearn_compute_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--minnorm", default="5001,12000")
    parser.add_argument("--deletions", type=int, default=2)
    parser.add_argument("--backends", default="filesystem,database,postgres,s3")
    args = parser.parse_args()
    size = args.size_mib << 20
    backends = args.backends.split(",")
    result: dict = {"size_bytes": size, "backends": {}, "minnorm": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        pg_url = stack.enter_context(scratch_database(migrate=False))
        seaweed = SeaweedServer(root / "seaweed")
        seaweed.start()
        try:
            s3 = {
                "blob_store": "s3",
                "s3_bucket": "lethe-bench",
                "s3_endpoint_url": seaweed.endpoint,
                "s3_access_key_id": S3_ACCESS_KEY,
                "s3_secret_access_key": S3_SECRET_KEY,
            }
            configs = {
                "filesystem": {"blob_store": "filesystem"},
                "database": {"blob_store": "database"},  # SQLite
                "postgres": {"blob_store": "database", "database_url": pg_url},
                "s3": s3,
            }
            result["plain_file_copy"] = file_copy(root, size)
            print("file copy", result["plain_file_copy"], flush=True)
            for name in backends:
                folder = root / f"rt-{name}"
                folder.mkdir()
                given = {"data_dir": str(folder), **configs[name]}
                result["backends"][name] = round_trip(given, size)
                print(name, result["backends"][name], flush=True)
            result["download"] = download(root / "download", size)
            print("download", result["download"], flush=True)
            for n in [int(x) for x in args.minnorm.split(",") if x]:
                result["minnorm"][str(n)] = {}
                for name in ("filesystem", "database", "s3"):
                    folder = root / f"mn-{n}-{name}"
                    run = minnorm(folder, n, args.deletions, configs[name])
                    result["minnorm"][str(n)][name] = run
                    print("minnorm", n, name, run, flush=True)
                    shutil.rmtree(folder, ignore_errors=True)
        finally:
            seaweed.kill()
            dispose_engines(pg_url)
    write_result("blobstore", result)


if __name__ == "__main__":
    main()
