"""A log the world can watch: C2SP checkpoints, tiles, tlog-proof receipts and
witnesses; checked with Go's reference packages and against a rewrite."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from app.core.db import append_only
from app.core.db.session import database, engine_for
from app.core.ledger import merkle, notes, tiles, transparency
from app.core.ledger.notes import Checkpoint, NoteError
from app.core.ledger.tiles import ProofPolicy, check_extension, verify_tlog_proof
from app.core.settings import Settings
from app.witness import create_witness_app
from tests.support.cluster import LETHE, Cluster, wait_for
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


# ---- formats, against the specifications' own examples ---------------------------------------


def test_tile_paths_and_widths_are_the_specifications() -> None:
    assert tiles.encode_index(1234067) == "x001/x234/067"  # c2sp.org/tlog-tiles
    assert tiles.encode_index(5) == "005" and tiles.encode_index(1000) == "x001/000"
    assert tiles.tile_path(0, 1234067, 3) == "tile/0/x001/x234/067.p/3"
    assert tiles.tile_path(None, 2) == "tile/entries/002"
    assert tiles.parse_tile_path("0/x001/x234/067.p/3") == tiles.TilePath(0, 1234067, 3)
    assert tiles.parse_tile_path("entries/002") == tiles.TilePath(None, 2, None)
    long_index = "/".join(["x123"] * 1500 + ["456"])  # 4,503 digits
    for bad in ["0/5", "00/005", "0/x001", "0/001/002", "0/005.p/0", "0/005.p/256", "64/000",
                f"0/{long_index}", "9" * 4500 + "/000", "0/005.p/" + "1" * 4500]:  # fmt: skip
        with pytest.raises(ValueError) as refused:
            tiles.parse_tile_path(bad)
        assert "int_max_str_digits" not in str(refused.value)
    assert tiles.parse_tile_path("0/" + tiles.encode_index(2**56)).index == 2**56
    # "a tree of size 70,000 will be represented by 273 full level 0 tiles, one partial level 0
    # tile of width 112, one full level 1 tile, one partial level 1 tile of width 17, and one
    # partial level 2 tile of width 1"
    assert [tiles.tile_width(70_000, 0, n) for n in (0, 272, 273, 274)] == [256, 256, 112, 0]
    assert [tiles.tile_width(70_000, 1, n) for n in (0, 1, 2)] == [256, 17, 0]
    assert tiles.tile_width(70_000, 2, 0) == 1 and tiles.tile_width(256, 1, 0) == 1


def test_notes_verify_by_known_keys_only() -> None:
    log_key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    verifier = notes.log_verifier("example.com/log", log_key.public_key())
    assert notes.Verifier.parse(verifier.vkey) == verifier
    checkpoint = Checkpoint("example.com/log", 7, bytes(range(32)))
    assert Checkpoint.parse(checkpoint.text) == checkpoint
    note = tiles.signed_checkpoint(checkpoint, log_key)
    assert notes.open_note(note, [verifier]).signed_by == ("example.com/log",)
    stranger = notes.with_signatures(note, [notes.sign(checkpoint.text, "else", other)])
    assert notes.open_note(stranger, [verifier]).signed_by == ("example.com/log",)  # ignored
    forged = note.replace("\n7\n", "\n8\n")
    with pytest.raises(NoteError, match="does not verify"):
        notes.open_note(forged, [verifier])
    with pytest.raises(NoteError, match="no signature by a known key"):
        notes.open_note(note, [notes.log_verifier("example.com/log", other.public_key())])
    witness = Ed25519PrivateKey.generate()
    wv = notes.witness_verifier("w.example/1", witness.public_key())
    line = notes.cosign(checkpoint.text, "w.example/1", witness, 1679315147)
    cosigned = notes.with_signatures(note, [line])
    opened = notes.open_note(cosigned, [verifier, wv])
    assert opened.signed_by == ("example.com/log", "w.example/1")
    assert opened.times == {"w.example/1": 1679315147}
    with pytest.raises(NoteError):
        notes.Verifier.parse(verifier.vkey.replace("+", "+0", 1))  # the key id must match
    root = base64.b64encode(bytes(32)).decode()
    assert Checkpoint.parse(f"o\n{2**64 - 1}\n{root}\n").size == 2**64 - 1
    for size in (str(2**64), "9" * 4500, "-1", "07", "٣"):  # a uint64, in ASCII
        with pytest.raises(NoteError, match="below 2\\^64"):
            Checkpoint.parse(f"o\n{size}\n{root}\n")


def test_witness_follows_the_specification(tmp_path: Path) -> None:
    """Each answer of c2sp.org/tlog-witness, from a witness in front of a log built here."""
    log_key, witness_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    origin = "example.com/log"
    verifier = notes.log_verifier(origin, log_key.public_key())
    app = create_witness_app("w.example/1", witness_key, [verifier], tmp_path / "state.json")
    me = notes.witness_verifier("w.example/1", witness_key.public_key())
    leaves = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(13)]

    def tree(n: int) -> Checkpoint:
        return Checkpoint(origin, n, merkle.root_of(leaves[:n]))

    def subtree(a: int, b: int) -> bytes:
        return merkle.root_of(leaves[a:b])

    def body(old: int, cp: Checkpoint, key: Ed25519PrivateKey = log_key, proof=None) -> bytes:
        if proof is None:
            proof = merkle.consistency_path(old, cp.size, subtree) if 0 < old < cp.size else []
        lines = "".join(base64.b64encode(h).decode() + "\n" for h in proof)
        return (f"old {old}\n{lines}\n" + tiles.signed_checkpoint(cp, key)).encode()

    with TestClient(app) as c:
        first = c.post("/add-checkpoint", content=body(0, tree(5)))
        assert first.status_code == 200, first.text
        cosigned = notes.with_signatures(tiles.signed_checkpoint(tree(5), log_key), [first.text])
        assert "w.example/1" in notes.open_note(cosigned, [me]).signed_by
        stale = c.post("/add-checkpoint", content=body(0, tree(9)))
        assert stale.status_code == 409 and stale.text == "5\n"
        assert stale.headers["content-type"].startswith("text/x.tlog.size")
        assert c.post("/add-checkpoint", content=body(5, tree(9))).status_code == 200
        wrong = merkle.consistency_path(9, 13, subtree)[::-1]
        assert c.post("/add-checkpoint", content=body(9, tree(13), proof=wrong)).status_code == 422
        fork = Checkpoint(origin, 9, bytes(32))
        assert c.post("/add-checkpoint", content=body(9, fork)).status_code == 409
        assert c.post("/add-checkpoint", content=body(13, tree(9))).status_code == 400
        other = Ed25519PrivateKey.generate()
        assert c.post("/add-checkpoint", content=body(9, tree(13), key=other)).status_code == 403
        unknown = Checkpoint("example.com/other", 3, merkle.root_of(leaves[:3]))
        assert c.post("/add-checkpoint", content=body(0, unknown)).status_code == 404
        assert c.post("/add-checkpoint", content=b"nonsense").status_code == 400
        huge = c.post("/add-checkpoint", content=b"old " + b"9" * 4500 + b"\n\n")
        assert huge.status_code == 400 and "int_max_str_digits" not in huge.text
        beyond = body(0, Checkpoint(origin, 2**64, merkle.root_of(leaves[:3])))
        assert c.post("/add-checkpoint", content=beyond).status_code == 400  # not uint64
        # a body over 64 KiB is refused, streamed or declared, and read no further
        streamed = c.post("/add-checkpoint", content=(b"B" * 2**16 for _ in range(4)))
        assert streamed.status_code == 413
        assert c.post("/add-checkpoint", content=b"B" * (2**16 + 1)).status_code == 413
        assert c.post("/add-checkpoint", content=body(9, tree(13))).status_code == 200
    restarted = create_witness_app("w.example/1", witness_key, [verifier], tmp_path / "state.json")
    with TestClient(restarted) as c:  # the state survives a restart
        assert c.post("/add-checkpoint", content=body(9, tree(13))).text == "13\n"


# ---- a live service ---------------------------------------------------------------------------


def _seed() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _vkey_of(seed: str, name: str, kind: int = notes.ED25519) -> str:
    key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed))
    return notes.Verifier(name, kind, notes.raw_public(key.public_key())).vkey


def _delete(c: httpx.Client, dataset_id: int, external_id: str) -> dict:
    request = c.post(
        "/v1/deletions", json={"dataset_id": dataset_id, "sample_ids": [external_id]}
    ).json()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = c.get(f"/v1/deletions/{request['id']}", params={"wait": 5}).json()
        if got["status"] in ("done", "failed"):
            assert got["status"] == "done", got
            return got
    raise AssertionError(f"deletion {request['id']} did not finish")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Cluster, httpx.Client, dict, list[str]]]:
    """`lethe serve` (embedded) with a trained model and its training sample ids."""
    seed = _seed()
    cluster = Cluster(
        tmp_path / "log", None, None, audit_signing_key=seed, log_origin="lethe.test/lethe/audit"
    )
    cluster.start_api()
    with cluster, cluster.client() as c:
        ds = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
        body = {"name": "m", "dataset_id": ds["id"], "architecture": {"type": "logreg"}}
        model = c.post("/v1/models", json=body).json()
        deadline = time.monotonic() + 120
        while c.get(f"/v1/models/{model['id']}").json()["status"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        page = c.get(f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 8})
        yield cluster, c, ds, [s["external_id"] for s in page.json()["items"]]


def _lethe(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*LETHE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.integration
@pytest.mark.long
def test_the_public_log_verifies_with_go_and_offline(served, tmp_path: Path) -> None:
    cluster, c, ds, ids = served
    public = httpx.Client(base_url=cluster.url, timeout=30)  # no key: the log is public
    vkey = public.get("/log/vkey").text.strip()
    assert vkey.startswith("lethe.test/lethe/audit+")
    assert public.get("/log/checkpoint").status_code == 404  # nothing logged yet
    first = _delete(c, ds["id"], ids[0])
    older = public.get("/log/checkpoint")
    assert older.status_code == 200 and older.headers["cache-control"] == "no-cache"
    (tmp_path / "older.checkpoint").write_text(older.text)
    for i in ids[1:4]:
        _delete(c, ds["id"], i)
    latest = public.get("/log/checkpoint").text
    checkpoint = Checkpoint.parse(notes.open_note(latest, [notes.Verifier.parse(vkey)]).text)
    assert checkpoint.size == 4
    bundle = public.get("/log/tile/entries/000.p/4")
    assert bundle.headers["cache-control"].endswith("immutable")
    leaf_tile = public.get("/log/tile/0/000.p/4").content
    entries = tiles.split_bundle(bundle.content)
    assert [merkle.leaf_hash(e) for e in entries] == [
        leaf_tile[32 * i : 32 * (i + 1)] for i in range(4)
    ]
    assert public.get("/log/tile/0/000").status_code == 404  # no full tile yet
    assert public.get("/log/tile/0/000.p/5").status_code == 404
    assert public.get("/log/tile/0/5").status_code == 404

    # Go's reference implementation, built from Debian's golang-golang-x-mod-dev
    binary = _build_go(tmp_path)
    run = subprocess.run(
        [str(binary), f"{cluster.url}/log", vkey, "2", str(tmp_path / "older.checkpoint")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout + run.stderr

    # the requester's receipt, checked offline against a policy naming the log's key
    cert = first["certificate_ids"][0]
    proof = c.get(f"/v1/deletions/{first['id']}/tlog-proofs/{cert}")
    assert proof.status_code == 200 and proof.text.startswith("c2sp.org/tlog-proof@v1\n")
    receipt, policy = tmp_path / "r.tlog-proof", tmp_path / "lethe.policy"
    receipt.write_text(proof.text)
    policy.write_text(f"log {vkey}\n")
    proven = verify_tlog_proof(proof.text, ProofPolicy.parse(policy.read_text()))
    assert proven.index == 0 and hashlib.sha256(proven.entry).digest() == entries[0]
    assert all(len(e) == 32 for e in entries)  # the public log holds hashes, not certificates
    ok = _lethe("audit", "verify-receipt", str(receipt), "--policy", str(policy), cwd=ROOT)
    assert ok.returncode == 0 and "included: entry 0" in ok.stdout, ok.stdout + ok.stderr
    lines = proof.text.split("\n")
    lines[1] = "extra " + base64.b64encode(b'{"forged": true}').decode()
    receipt.write_text("\n".join(lines))
    bad = _lethe("audit", "verify-receipt", str(receipt), "--policy", str(policy), cwd=ROOT)
    assert bad.returncode != 0 and "does not verify" in bad.stdout + bad.stderr

    # a monitor that saw the log follows it; after a rewrite it exits 1
    state = tmp_path / "monitor.state"
    watch = ["audit", "monitor", f"{cluster.url}/log", "--policy", str(policy)]
    watch += ["--state", str(state), "--once"]
    assert _lethe(*watch, cwd=ROOT).returncode == 0
    _rewrite_first_certificate(cluster)
    _delete(c, ds["id"], ids[4])  # a new head on the rewritten history, published unwitnessed
    caught = _lethe(*watch, cwd=ROOT)
    assert caught.returncode == 1 and "rewritten" in caught.stdout, caught.stdout


@pytest.mark.integration
def test_a_witnessed_log_cannot_publish_a_rewrite(tmp_path: Path) -> None:
    """With a witness (`lethe witness`) and a quorum of 1: checkpoints carry its cosignature,
    receipts verify under a policy that needs it, and after a rewrite the witness refuses
    the next checkpoint, so the log cannot publish it."""
    seed, witness_seed = _seed(), _seed()
    origin = "lethe.test/lethe/witnessed"
    key_file = tmp_path / "witness.key"
    key_file.write_text(witness_seed + "\n")
    key_file.chmod(0o600)
    port = free_port()
    witness_vkey = _vkey_of(witness_seed, "witness.test/w1", notes.COSIGNATURE)
    witness = subprocess.Popen(
        [*LETHE, "witness", "--name", "witness.test/w1", "--key-file", str(key_file)]
        + ["--log", _vkey_of(seed, origin), "--state", str(tmp_path / "witness.json")]
        + ["--port", str(port)],
        cwd=ROOT,
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/vkey")
        cluster = Cluster(
            tmp_path / "log",
            None,
            None,
            audit_signing_key=seed,
            log_origin=origin,
            log_witnesses=[f"http://127.0.0.1:{port} {witness_vkey}"],
        )
        cluster.start_api()
        with cluster, cluster.client() as c:
            ds = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
            body = {"name": "m", "dataset_id": ds["id"], "architecture": {"type": "logreg"}}
            model = c.post("/v1/models", json=body).json()
            while c.get(f"/v1/models/{model['id']}").json()["status"] != "ready":
                time.sleep(0.2)
            page = c.get(f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 4})
            ids = [s["external_id"] for s in page.json()["items"]]
            done = [_delete(c, ds["id"], i) for i in ids[:2]]
            policy = ProofPolicy.parse(
                f"log {_vkey_of(seed, origin)}\nwitness {witness_vkey}\nquorum 1\n"
            )
            note = _published(cluster.url, 2)
            opened = notes.open_note(note, [policy.log, *policy.witnesses])
            assert opened.signed_by == (origin, "witness.test/w1")
            go = _build_go(tmp_path)  # Go checks the cosignature too, from the specification
            args = [str(go), f"{cluster.url}/log", _vkey_of(seed, origin), "1", "-"]
            cosigned = subprocess.run([*args, witness_vkey], capture_output=True, text=True)
            assert cosigned.returncode == 0, cosigned.stdout + cosigned.stderr
            stranger = _vkey_of(_seed(), "witness.test/w1", notes.COSIGNATURE)
            unknown = subprocess.run([*args, stranger], capture_output=True, text=True)
            assert unknown.returncode == 1 and "no cosignature" in unknown.stdout
            second = done[1]
            proof = c.get(
                f"/v1/deletions/{second['id']}/tlog-proofs/{second['certificate_ids'][0]}"
            )
            assert verify_tlog_proof(proof.text, policy).cosigned_by == ("witness.test/w1",)
            stripped = "\n".join(ln for ln in proof.text.split("\n") if "witness.test" not in ln)
            with pytest.raises(NoteError, match="0 of the 1 witness"):
                verify_tlog_proof(stripped, policy)

            _rewrite_first_certificate(cluster)
            late = _delete(c, ds["id"], ids[2])
            time.sleep(2)  # the worker and the reconciler both tried to publish size 3
            assert Checkpoint.parse(notes.split(_published(cluster.url, 2))[0]).size == 2
            refused = c.get(f"/v1/deletions/{late['id']}/tlog-proofs/{late['certificate_ids'][0]}")
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == "not_yet_published"
            api_log = (cluster.data_dir / "api.log").read_text()
            assert "witness witness.test/w1: 422" in api_log, api_log[-2000:]
    finally:
        witness.kill()
        witness.wait(timeout=10)


def test_extension_from_tiles_catches_a_fork() -> None:
    leaves = [merkle.leaf_hash(f"e{i}".encode()) for i in range(300)]
    nodes: dict[str, bytes] = {}
    for level in range(2):
        for index in range(2):
            width = tiles.tile_width(300, level, index)
            if width:
                first, span = index * 256, 256**level
                data = b"".join(
                    merkle.root_of(leaves[(first + i) * span : (first + i + 1) * span])
                    for i in range(width)
                )
                nodes[tiles.tile_path(level, index, None if width == 256 else width)] = data
    old = Checkpoint("o", 100, merkle.root_of(leaves[:100]))
    new = Checkpoint("o", 300, merkle.root_of(leaves))
    check_extension(old, new, nodes.__getitem__)  # from the tiles alone
    forked = Checkpoint("o", 100, merkle.root_of([merkle.leaf_hash(b"x"), *leaves[1:100]]))
    with pytest.raises(NoteError, match="rewritten"):
        check_extension(forked, new, nodes.__getitem__)
    with pytest.raises(NoteError, match="shrank"):
        check_extension(new, old, nodes.__getitem__)


# ---- helpers -----------------------------------------------------------------------------------


def _rewrite_first_certificate(cluster: Cluster) -> None:
    """What the log's operator could do with the database and the key: change certificate 1
    and rebuild the tree and its heads, validly signed."""
    url = f"sqlite:///{cluster.data_dir / 'lethe.db'}"
    seed = cluster.env["LETHE_AUDIT_SIGNING_KEY"]
    settings = Settings(data_dir=cluster.data_dir, audit_signing_key=seed)
    with engine_for(url).begin() as conn, append_only.lifted(conn):
        conn.exec_driver_sql("UPDATE certificates SET body = body || ' ' WHERE seq = 1")
        session = Session(bind=conn)
        transparency.rebuild(session, transparency.signing_key(settings))
        session.flush()


def _published(url: str, size: int, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/log/checkpoint", timeout=10)
        if answer.status_code == 200 and int(answer.text.split("\n")[1]) >= size:
            return answer.text
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of size {size} published")


def _build_go(folder: Path) -> Path:
    go = shutil.which("go")
    assert go, "Go is installed by scripts/test-prerequisites (golang-go)"
    binary = folder / "tlogcheck"
    env = {
        **os.environ,
        "GO111MODULE": "off",  # Debian's golang-golang-x-mod-dev: a GOPATH tree, no module
        "GOPATH": "/usr/share/gocode",
        "GOCACHE": str(folder / "gocache"),
        "HOME": str(folder),
        "GOFLAGS": "",
    }
    source = ROOT / "tests" / "support" / "go" / "tlogcheck" / "main.go"
    built = subprocess.run(
        [go, "build", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    return binary


def test_the_public_tree_is_built_for_certificates_logged_before_it(tmp_path: Path) -> None:
    """Migration 0013 builds the public log's tree from the certificates already in a
    database; it equals the tree grown with them, and its leaves are the bodies' hashes."""
    from alembic import command
    from sqlalchemy import select

    from app.core.db.migrate import alembic_config, upgrade_to_head
    from app.core.db.tables import Certificate, PublicNode
    from app.core.ledger.transparency import StoredNodes
    from tests.integration.test_audit import write_chain

    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    write_chain(url, 5)
    with database(url).read() as session:
        grown = StoredNodes(session, PublicNode).subtree(0, 5)
        bodies = session.scalars(select(Certificate.body).order_by(Certificate.seq)).all()
    expected = merkle.root_of(
        [merkle.leaf_hash(hashlib.sha256(b.encode()).digest()) for b in bodies]
    )
    assert grown == expected
    command.downgrade(alembic_config(url), "0012")  # an older database: no public tree
    engine_for(url).dispose()
    upgrade_to_head(url)
    with database(url).read() as session:
        assert StoredNodes(session, PublicNode).subtree(0, 5) == expected


def test_full_tiles_are_served_and_kept(tmp_path: Path) -> None:
    """300 certificates: one full level-0 tile and bundle (256), a partial one (44); a full
    tile served twice is the same bytes, and it is the public tree's."""
    from app.core.db.migrate import upgrade_to_head
    from app.main import create_app
    from tests.integration.test_audit import write_chain

    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    write_chain(url, 300)
    settings = Settings(data_dir=tmp_path, database_url=url, bootstrap_admin_key=False)
    with TestClient(create_app(settings)) as c:
        first, again = c.get("/log/tile/0/000"), c.get("/log/tile/0/000")
        assert first.status_code == 200 and len(first.content) == 256 * 32
        assert again.content == first.content
        assert first.headers["cache-control"].endswith("immutable")
        partial = c.get("/log/tile/0/001.p/44")
        assert len(partial.content) == 44 * 32
        bundle = tiles.split_bundle(c.get("/log/tile/entries/000").content)
        assert len(bundle) == 256 and all(len(e) == 32 for e in bundle)
        leaves = [merkle.leaf_hash(e) for e in bundle]
        assert b"".join(leaves) == first.content
        level1 = c.get("/log/tile/1/000.p/1").content  # the full tile's root, one level up
        assert level1 == merkle.root_of(leaves)
        assert c.get("/log/tile/1/000").status_code == 404
