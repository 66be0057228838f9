"""The audit log's Merkle tree, signed heads, proofs and receipts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.cli import CliError, audit_verify_receipt
from app.core.db import append_only
from app.core.db.session import database, engine_for
from app.core.ledger import merkle, transparency
from app.core.ledger.receipts import ReceiptError, verify_extension, verify_head, verify_receipt
from app.core.settings import Settings
from tests.conftest import Api

ROOT = Path(__file__).resolve().parents[2]


def leaves(n: int) -> list[bytes]:
    return [merkle.leaf_hash(f"entry {i}".encode()) for i in range(n)]


def from_list(hashes: list[bytes]):  # type: ignore[no-untyped-def]
    return lambda start, end: merkle.root_of(hashes[start:end])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 64, 100, 255, 256, 300])
def test_proofs_verify_at_every_size_and_fail_when_altered(n: int) -> None:
    """Against a from-scratch tree: every leaf's inclusion and every earlier size's
    consistency verify; a wrong leaf, a wrong index or a truncated path does not."""
    hashes = leaves(n)
    subtree, root = from_list(hashes), merkle.root_of(hashes)
    step = max(1, n // 40)
    for m in range(0, n, step):
        path = merkle.inclusion_path(m, n, subtree)
        assert merkle.verify_inclusion(hashes[m], m, n, path, root)
        assert not merkle.verify_inclusion(merkle.leaf_hash(b"other"), m, n, path, root)
        if n > 1:
            assert not merkle.verify_inclusion(hashes[m], (m + 1) % n, n, path, root)
            assert not merkle.verify_inclusion(hashes[m], m, n, path[:-1], root)
    for first in range(1, n + 1, step):
        path = merkle.consistency_path(first, n, subtree)
        old_root = merkle.root_of(hashes[:first])
        assert merkle.verify_consistency(first, n, path, old_root, root)
        if first < n:
            assert not merkle.verify_consistency(first, n, path, merkle.leaf_hash(b"x"), root)
            assert not merkle.verify_consistency(first, n, path[:-1], old_root, root)


def test_proof_sizes_at_a_million() -> None:
    sizes = merkle.proof_sizes(10**6)
    assert sizes["inclusion_first_leaf"] == 20 and sizes["inclusion_last_leaf"] <= 20
    assert sizes["consistency_from_half"] <= 21


def delete(api: Api, dataset_id: int, offset: int) -> dict:
    page = api.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "limit": 1, "offset": offset},
    ).json()
    ids = [s["external_id"] for s in page["items"]]
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": dataset_id, "sample_ids": ids}
    ).json()
    done = api.get(f"/v1/deletions/{req['id']}", role="requester", params={"wait": 30}).json()
    return {**done, "opening": req["opening"], "ids": ids}  # what the requester keeps


def test_receipts_verify_and_a_rewritten_log_fails_its_consistency_check(
    api: Api, ready_model: dict, tmp_path: Path, settings: Settings
) -> None:
    dataset_id = ready_model["dataset_id"]
    keys = api.get("/v1/audit/public-key").json()  # public: no key needed
    assert len(keys["keys"]) == 1 and keys["keys"][0]["current"]
    done = [delete(api, dataset_id, i) for i in range(3)]
    receipts = [d["receipts"][0] for d in done]
    heads = [verify_receipt(r, keys) for r in receipts]
    assert [h["tree_size"] for h in heads] == [1, 2, 3]

    # The stored tree is the from-scratch tree of the certificates' bodies.
    with database(api.url).read() as session:
        bodies = [
            b.encode()
            for b in session.scalars(sa.text("SELECT body FROM certificates ORDER BY seq"))
        ]
    latest = api.get("/v1/audit/head", role="reader").json()
    witnessing = latest.pop("witnesses")  # the embedded default: no witness, and it says so
    assert witnessing["configured"] == 0 and witnessing["quorum"] == 0
    assert latest["root_hash"] == merkle.root_of([merkle.leaf_hash(b) for b in bodies]).hex()
    for receipt in receipts:
        proof = api.get(
            "/v1/audit/proof/consistency",
            params={"first": receipt["tree_size"], "second": latest["tree_size"]},
        ).json()
        verify_extension(receipt["tree_head"], latest, proof, keys)
    proof = api.get(
        "/v1/audit/proof/inclusion", params={"certificate": done[0]["certificate_ids"][0]}
    )
    assert proof.json()["tree_size"] == 3 and proof.json()["tree_head"] == latest

    # Whoever holds the database rewrites a certificate and rebuilds the tree, same key.
    with engine_for(api.url).begin() as conn, append_only.lifted(conn):
        conn.exec_driver_sql(
            "UPDATE certificates SET body = replace(body, 'Exact', 'Fine') WHERE seq = 1"
        )
        session = Session(bind=conn)
        rewritten = transparency.rebuild(session, transparency.signing_key(settings))
        session.flush()
    verify_head(rewritten, keys)  # a validly signed head ...
    for receipt in receipts:  # ... that no receipt issued earlier accepts
        proof = api.get(
            "/v1/audit/proof/consistency",
            params={"first": receipt["tree_size"], "second": rewritten["tree_size"]},
        ).json()
        with pytest.raises(ReceiptError, match="rewritten"):
            verify_extension(receipt["tree_head"], rewritten, proof, keys)


def test_rotation_keeps_old_receipts_valid_and_unknown_keys_are_refused(
    api: Api, ready_model: dict
) -> None:
    dataset_id = ready_model["dataset_id"]
    before = delete(api, dataset_id, 0)["receipts"][0]
    old_id, new_id = transparency.rotate(api.runtime.settings)
    after = delete(api, dataset_id, 1)["receipts"][0]
    keys = api.get("/v1/audit/public-key").json()
    assert old_id != new_id and {k["key_id"] for k in keys["keys"]} == {old_id, new_id}
    assert before["tree_head"]["key_id"] == old_id and after["tree_head"]["key_id"] == new_id
    verify_receipt(before, keys)
    verify_receipt(after, keys)
    only_new = {"keys": [k for k in keys["keys"] if k["key_id"] == new_id]}
    with pytest.raises(ReceiptError, match="unknown key"):
        verify_receipt(before, only_new)
    forged = {**after, "tree_head": {**after["tree_head"], "root_hash": "00" * 32}}
    with pytest.raises(ReceiptError, match="bad signature"):
        verify_receipt(forged, keys)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # no storage question here
def test_the_verifier_runs_from_a_fresh_folder_with_the_files_alone(
    api: Api, ready_model: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset_id = ready_model["dataset_id"]
    first = delete(api, dataset_id, 0)
    receipt = first["receipts"][0]
    delete(api, dataset_id, 1)
    head = api.get("/v1/audit/head", role="reader").json()
    proof = api.get(
        "/v1/audit/proof/consistency",
        params={"first": receipt["tree_size"], "second": head["tree_size"]},
    ).json()
    folder = tmp_path / "fresh"
    folder.mkdir()
    files = {
        "receipt.json": receipt,
        "keys.json": api.get("/v1/audit/public-key").json(),
        "head.json": head,
        "proof.json": proof,
    }
    for name, doc in files.items():
        (folder / name).write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    args = [
        sys.executable,
        "-m",
        "app.cli",
        "audit",
        "verify-receipt",
        "receipt.json",
        "--keys",
        "keys.json",
        "--head",
        "head.json",
        "--consistency",
        "proof.json",
    ]
    env["PYTHONPATH"] = str(ROOT)
    ok = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "included" in ok.stdout and "consistent" in ok.stdout
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)  # nothing else needed

    # The other options, in process (the command's own function; a subprocess each was 2.5 s)
    def verify(**more: object) -> None:
        audit_verify_receipt(folder / "receipt.json", keys=folder / "keys.json", **more)

    verify(opening=first["opening"], sample_id=first["ids"][0:1])
    assert "committed" in capsys.readouterr().out
    with pytest.raises(CliError, match="does not commit"):
        verify(opening=first["opening"], sample_id=["not-" + first["ids"][0]])
    with pytest.raises(CliError, match="go together"):  # a head alone checks nothing
        verify(head=folder / "head.json")
    corrupt = {**proof, "consistency_path": ["00" * 32] * len(proof["consistency_path"])}
    (folder / "proof.json").write_text(json.dumps(corrupt))
    with pytest.raises(CliError, match="corrupt or the log was rewritten"):
        verify(head=folder / "head.json", consistency=folder / "proof.json")
    (folder / "proof.json").write_text(json.dumps(proof))
    receipt["entry"] = receipt["entry"].replace("Exact", "Fine")
    (folder / "receipt.json").write_text(json.dumps(receipt))
    bad = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "does not hash" in bad.stderr


def test_frontier_lists_the_complete_subtrees_that_tile_a_tree() -> None:
    for size in range(0, 70):
        tiles = transparency.frontier(size)
        covered = 0
        for level, index in tiles:
            assert index << level == covered  # aligned, left to right, no gap
            covered += 1 << level
        assert covered == size and len(tiles) == bin(size).count("1")


def test_appends_read_no_node_with_the_kept_frontier_and_sign_a_fresh_trees_root(
    tmp_path: Path,
) -> None:
    """The worker keeps both trees' frontiers between appends: an append then reads
    no stored node, and every head it signs is the root of a tree built from scratch; a rolled
    back append leaves nothing stale behind."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from app.core.db.migrate import upgrade_to_head
    from app.core.ledger.certificates import append_certificates

    url = f"sqlite:///{tmp_path / 'tree.db'}"
    upgrade_to_head(url)
    db, key = database(url), Ed25519PrivateKey.generate()
    reads: list[str] = []

    @sa.event.listens_for(db.engine, "before_cursor_execute")
    def count(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT") and (
            "FROM merkle_nodes" in statement or "FROM public_nodes" in statement
        ):
            reads.append(statement)

    def fields(i: int) -> dict:
        return {
            "request_id": i,
            "model_id": 1,
            "from_version": i,
            "to_version": i + 1,
            "method": "output_perturbation",
            "guarantee": "certified",
            "epsilon": 1.0,
            "delta": 1e-5,
            "cumulative_epsilon": 1.0,
            "cumulative_delta": 1e-5,
            "n_removed": 1,
        }

    bodies: list[str] = []
    for i in range(1, 24):
        reads.clear()
        if i == 9:  # an append that rolls back: its nodes must not be trusted afterwards
            with pytest.raises(RuntimeError), db.write() as session:
                append_certificates(session, [fields(999)], key)
                raise RuntimeError("the commit failed")
        with db.write() as session:
            bodies += [c.body for c in append_certificates(session, [fields(i), fields(-i)], key)]
        with db.read() as session:
            head = transparency.latest_head(session)
        expected = merkle.root_of([merkle.leaf_hash(b.encode()) for b in bodies])
        assert head["tree_size"] == len(bodies) and head["root_hash"] == expected.hex()
        if i > 1 and i != 9:
            assert reads == []  # the frontier was kept: no node read
        if i == 9:
            assert reads  # after the rollback it was forgotten and read again

    # Proofs read their nodes in one query each (issue 28: a receipt was one primary-key lookup
    # per node) and verify against the root of the tree built from scratch.
    sa.event.listen(engine_for(url, readonly=True), "before_cursor_execute", count)
    with db.read() as session:
        ids = session.scalars(sa.text("SELECT id FROM certificates ORDER BY seq")).all()
        size = len(bodies)
        root = merkle.root_of([merkle.leaf_hash(b.encode()) for b in bodies])
        for cert_id in ids:
            reads.clear()
            proof = transparency.inclusion(session, cert_id, size)
            assert len(reads) <= 1
            path = [bytes.fromhex(h) for h in proof["inclusion_path"]]
            leaf = bytes.fromhex(proof["leaf_hash"])
            assert proof["root_hash"] == root.hex()
            assert merkle.verify_inclusion(leaf, proof["leaf_index"], size, path, root)
        for first in (1, 5, 17, size - 1):
            reads.clear()
            made = transparency.consistency(session, first, size)
            assert len(reads) <= 1 and made["second_root"] == root.hex()
            steps = [bytes.fromhex(h) for h in made["consistency_path"]]
            old = bytes.fromhex(made["first_root"])
            assert merkle.verify_consistency(first, size, steps, old, root)
    sa.event.remove(engine_for(url, readonly=True), "before_cursor_execute", count)


def test_receipts_reuse_the_nodes_earlier_proofs_read_and_drop_them_when_they_do_not_prove(
    tmp_path: Path,
) -> None:
    """A receipt for the newest certificate needs the nodes the previous receipt read (issue
    28): after the first, sequential receipts read no stored node. Every receipt's proof
    verifies against its signed head; a wrong node among the kept ones (a database restored
    under the process) is noticed by that check, dropped, and the proof read again."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from app.core.db.migrate import upgrade_to_head
    from app.core.ledger.certificates import append_certificates

    url = f"sqlite:///{tmp_path / 'receipts.db'}"
    upgrade_to_head(url)
    db, key = database(url), Ed25519PrivateKey.generate()
    reads: list[str] = []

    def count(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        if "FROM merkle_nodes" in statement:
            reads.append(statement)

    sa.event.listen(engine_for(url, readonly=True), "before_cursor_execute", count)
    fields = {"model_id": 1, "method": "output_perturbation", "guarantee": "certified",
              "epsilon": 1.0, "delta": 1e-5, "cumulative_epsilon": 1.0,
              "cumulative_delta": 1e-5, "n_removed": 1}  # fmt: skip

    def receipt_of_newest(i: int) -> dict:
        with db.write() as session:
            cert_id = append_certificates(
                session, [{**fields, "request_id": i, "from_version": i, "to_version": i + 1}], key
            )[0].id
        reads.clear()
        with db.read() as session:
            made = transparency.receipt(session, cert_id)
        root = bytes.fromhex(made["tree_head"]["root_hash"])
        path = [bytes.fromhex(h) for h in made["inclusion_path"]]
        leaf = bytes.fromhex(made["leaf_hash"])
        assert merkle.verify_inclusion(leaf, made["leaf_index"], made["tree_size"], path, root)
        return made

    try:
        for i in range(1, 40):
            receipt_of_newest(i)
            if i > 2:
                assert reads == [], i  # the previous receipt read every node this one needs
        kept = db.own(transparency.ProvenNodes)._held
        assert kept
        for node in kept:  # poison every kept node
            kept[node] = bytes(32)
        receipt_of_newest(40)  # still a valid proof: read again from the database
        assert reads
        assert bytes(32) not in db.own(transparency.ProvenNodes).known().values()
        receipt_of_newest(41)
        assert reads == []
    finally:
        sa.event.remove(engine_for(url, readonly=True), "before_cursor_execute", count)
        db.own(transparency.ProvenNodes).forget()
