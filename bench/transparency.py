"""The Merkle tree's cost: certificate append latency with and without the tree
and its signed head, on SQLite and PostgreSQL; proof generation time against tree size; and
proof sizes at 10^6 certificates (computed).

Appends go through `app.core.ledger.certificates.append_certificates` exactly as a deletion update
does, in batches of 1 (one request per update) and 100 (a coalesced update), into a fresh
database; "without" replaces `transparency.append` by a no-op for the same run.

    .venv/bin/python -m bench.transparency [--certificates 400] [--out transparency]

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.jsontypes import JsonObject
from app.core.ledger import certificates as audit
from app.core.ledger import merkle, transparency
from bench.common import scratch_database, write_result


def fields(i: int) -> dict[str, Any]:
    return {
        "request_id": i,
        "model_id": 1,
        "from_version": i,
        "to_version": i + 1,
        "method": "retrain",
        "guarantee": "exact",
        "epsilon": 0.0,
        "delta": 0.0,
        "cumulative_epsilon": 0.0,
        "cumulative_delta": 0.0,
        "n_removed": 1,
        "sentence": "Exact: retrained from scratch on the retained samples " * 4,
    }


def appends(url: str, n: int, batch: int, tree: bool) -> float:
    """Milliseconds per certificate appended (commit included)."""
    original = transparency.append
    if not tree:  # the tree left as it was: an empty one

        def no_tree(session: Any, certs: Any, signer: Any, newest: Any) -> tuple[JsonObject, list]:
            return {"tree_size": 0, "root_hash": ""}, []  # no nodes, no head to insert

        transparency.append = no_tree  # type: ignore[assignment]
    signer = Ed25519PrivateKey.generate()
    try:
        db = database(url)
        start = time.perf_counter()
        for b in range(0, n, batch):
            with db.write() as session:
                audit.append_certificates(session, [fields(b + i) for i in range(batch)], signer)
        return (time.perf_counter() - start) * 1000 / n
    finally:
        transparency.append = original


def proofs(url: str, samples: int = 50) -> dict[str, float]:
    """Milliseconds per inclusion and consistency proof at the tree's current size."""
    with database(url).read() as session:
        size = transparency.leaf_count(session)
        start = time.perf_counter()
        for i in range(samples):
            transparency.inclusion(session, 1 + (i * 7919) % size, size)
        inclusion = (time.perf_counter() - start) * 1000 / samples
        start = time.perf_counter()
        for i in range(samples):
            transparency.consistency(session, 1 + (i * 7919) % size, size)
        consistency = (time.perf_counter() - start) * 1000 / samples
    return {"tree_size": size, "inclusion_ms": inclusion, "consistency_ms": consistency}


def receipts(url: str, n: int) -> float:
    """Milliseconds per receipt of the newest certificate, each after its own append (what a
    requester's finished deletion reads: `transparency.receipt`, its proof reusing the nodes
    earlier receipts read)."""
    signer = Ed25519PrivateKey.generate()
    db = database(url)
    spent = 0.0
    for i in range(n):
        with db.write() as session:
            newest = audit.append_certificates(session, [fields(i)], signer)[0].id
        with db.read() as session:
            start = time.perf_counter()
            transparency.receipt(session, newest)
            spent += time.perf_counter() - start
    return spent * 1000 / n


def run(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("sqlite", "postgres"):
            for batch in (1, 100):
                for tree in (False, True):
                    with contextlib.ExitStack() as stack:
                        if backend == "sqlite":
                            url = f"sqlite:///{tmp}/{batch}-{tree}.db"
                        else:
                            url = stack.enter_context(scratch_database(migrate=False))
                        upgrade_to_head(url)
                        ms = appends(url, n, batch, tree)
                        key = f"{backend}_batch{batch}_{'with' if tree else 'without'}_tree"
                        out[key] = {"ms_per_certificate": ms}
                        if tree and batch == 100:
                            out[f"{backend}_proofs"] = proofs(url)
                        if tree and batch == 1:
                            out[f"{backend}_newest_receipt_ms"] = receipts(url, n)
                            print(key, "receipt", round(out[f"{backend}_newest_receipt_ms"], 3))
                        print(key, round(ms, 3), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--certificates", type=int, default=400)
    parser.add_argument("--out", default="transparency", help="bench/results/<out>.json")
    args = parser.parse_args()
    result = {
        "certificates": args.certificates,
        "append": run(args.certificates),
        "proof_sizes_at_1e6": {
            **merkle.proof_sizes(10**6),
            "bytes_per_hash": 32,
        },
    }
    print(result["proof_sizes_at_1e6"])
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
