"""The public log's cost (issue 30), side by side in one run: certificate appends per second
when every append is published as a checkpoint cosigned by 0, 1 or 3 witnesses (in-process
witness apps, and `lethe witness` processes over HTTP), with one append or 64 per checkpoint;
hash-tile serving throughput from `lethe serve`; and proof and receipt sizes at 10^6 entries.

Appends go through `append_certificates` into a fresh SQLite database, as a deletion update
does; publication through `app.ledger.publish.publish`, as the worker does after a commit.
The reference is Tessera's published POSIX figure (about 10,000 entries/s on 7 cores and
NVMe, batching many entries per checkpoint), scaled by cores to this machine.

    .venv/bin/python -m bench.witnessed_log [--seconds 8]

Writes bench/results/witnessed_log.json.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from app.db.migrate import upgrade_to_head
from app.db.session import database
from app.ledger import certificates as audit
from app.ledger import merkle, notes
from app.ledger.publish import publish
from app.ledger.tiles import tile_path
from app.settings import Settings
from app.witness import create_witness_app
from bench.cluster import LETHE, Cluster, wait_for
from bench.common import write_result
from bench.transparency import fields
from tests.servers import free_port

TESSERA_ENTRIES_PER_S = 10_000
TESSERA_CORES = 7


def _seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def run(folder: Path, n_witnesses: int, mode: str, batch: int, seconds: float) -> dict:
    """Appends/s with every batch published under a quorum of all `n_witnesses`."""
    folder.mkdir(parents=True)
    url = f"sqlite:///{folder / 'lethe.db'}"
    upgrade_to_head(url)
    db = database(url)
    seed = _seed()
    origin = f"bench.lethe/{folder.name}"
    log_key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed))
    log_vkey = notes.log_verifier(origin, log_key.public_key()).vkey
    witness_keys = [Ed25519PrivateKey.generate() for _ in range(n_witnesses)]
    procs: list[subprocess.Popen] = []
    clients: dict[str, httpx.Client] = {}
    entries: list[str] = []
    for i, key in enumerate(witness_keys):
        name = f"w{i}.bench"
        vkey = notes.witness_verifier(name, key.public_key()).vkey
        if mode == "in-process":
            app = create_witness_app(
                name, key, [notes.Verifier.parse(log_vkey)], folder / f"w{i}.json"
            )
            base = f"http://w{i}.inprocess"
            clients[base] = TestClient(app, base_url=base)
        else:
            port = free_port()
            key_file = folder / f"w{i}.key"
            seed_w = key.private_bytes_raw()
            key_file.write_text(base64.b64encode(seed_w).decode() + "\n")
            key_file.chmod(0o600)
            procs.append(
                subprocess.Popen(
                    [*LETHE, "witness", "--name", name, "--key-file", str(key_file)]
                    + ["--log", log_vkey, "--state", str(folder / f"w{i}.json")]
                    + ["--port", str(port)]
                )
            )
            base = f"http://127.0.0.1:{port}"
            wait_for(f"{base}/vkey")
            clients[base] = httpx.Client()  # keep-alive, as the specification recommends
        entries.append(f"{base} {vkey}")
    settings = Settings(
        data_dir=folder,
        database_url=url,
        audit_signing_key=seed,
        log_origin=origin,
        log_witnesses=entries,
    )
    try:
        appended, checkpoints = 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            with db.write() as session:
                audit.append_certificates(
                    session, [fields(appended + i) for i in range(batch)], log_key
                )
            appended += batch
            published = publish(db, settings, clients)
            assert published is not None and published.tree_size == appended, "not published"
            checkpoints += 1
        elapsed = time.perf_counter() - start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        for client in clients.values():
            client.close()
    return {
        "witnesses": n_witnesses,
        "mode": mode,
        "entries_per_checkpoint": batch,
        "entries": appended,
        "checkpoints": checkpoints,
        "entries_per_s": appended / elapsed,
        "checkpoints_per_s": checkpoints / elapsed,
        "ms_per_checkpoint": 1000 * elapsed / checkpoints,
    }


def tiles(folder: Path, certificates: int, seconds: float, threads: int = 4) -> dict:
    """Full hash tiles served per second by `lethe serve` (embedded) over HTTP."""
    folder.mkdir(parents=True)
    url = f"sqlite:///{folder / 'lethe.db'}"
    upgrade_to_head(url)
    key = Ed25519PrivateKey.generate()
    db = database(url)
    for b in range(0, certificates, 500):
        with db.write() as session:
            audit.append_certificates(session, [fields(b + i) for i in range(500)], key)
    full = certificates // 256
    with Cluster(folder, None, None) as cluster:
        base = cluster.start_api()
        served = [0]
        stop = time.perf_counter() + seconds

        def fetch() -> None:
            with httpx.Client(base_url=base) as c:
                i = 0
                while time.perf_counter() < stop:
                    n = i % full
                    answer = c.get(f"/log/{tile_path(0, n)}")
                    assert answer.status_code == 200 and len(answer.content) == 8192
                    served[0] += 1
                    i += 1

        start = time.perf_counter()
        workers = [threading.Thread(target=fetch) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
    return {
        "certificates": certificates,
        "client_threads": threads,
        "tiles_per_s": served[0] / elapsed,
        "mib_per_s": served[0] * 8192 / elapsed / 2**20,
    }


def sizes(n: int = 10**6) -> dict:
    counts = merkle.proof_sizes(n)
    inclusion = max(counts["inclusion_first_leaf"], counts["inclusion_last_leaf"])
    b64 = len(base64.b64encode(bytes(32)))
    checkpoint = len(f"lethe.example/lethe/audit\n{n}\n") + b64 + 1
    signature = len("— lethe.example/lethe/audit ") + len(base64.b64encode(bytes(68))) + 1
    cosignature = len("— w1.witness.example ") + len(base64.b64encode(bytes(76))) + 1
    entry = 1200  # a certificate body is about 1.2 kB of JSON
    proof_file = (
        len("c2sp.org/tlog-proof@v1\n")
        + len("extra ")
        + len(base64.b64encode(bytes(entry)))
        + 1
        + len(f"index {n - 1}\n")
        + inclusion * (b64 + 1)
        + 1
        + checkpoint
        + 1
        + signature
        + 3 * cosignature
    )
    return {
        "tree_size": n,
        **counts,
        "inclusion_proof_bytes": 32 * inclusion,
        "tlog_proof_file_bytes_with_3_cosignatures": proof_file,
        "full_tiles_level_0": n // 256,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    result: dict = {"runs": [], "cores": cores}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for batch in (1, 64):
            for n in (0, 1, 3):
                for mode in ("in-process", "http") if n else ("none",):
                    folder = root / f"b{batch}-w{n}-{mode}"
                    got = run(folder, n, mode, batch, args.seconds)
                    result["runs"].append(got)
                    print(got, flush=True)
        result["tiles"] = tiles(root / "tiles", 20_000, args.seconds)
        print(result["tiles"], flush=True)
    result["sizes_at_1e6"] = sizes()
    result["tessera_reference"] = {
        "entries_per_s_published": TESSERA_ENTRIES_PER_S,
        "cores": TESSERA_CORES,
        "scaled_to_this_machine": TESSERA_ENTRIES_PER_S * cores / TESSERA_CORES,
        "source": "issue 30's figure for Tessera's POSIX driver (NVMe, 7 cores)",
    }
    write_result("witnessed_log", result)


if __name__ == "__main__":
    main()
