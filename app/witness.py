"""`lethe witness`: a C2SP tlog-witness, independent of Lethe's database.

It trusts a list of logs (their vkeys; a log's origin is its key's name), keeps the latest
checkpoint it cosigned for each in one JSON file (replaced atomically, under a lock, before it
answers), and on `POST /add-checkpoint` checks, in the order the specification gives: a known
origin (404), the log's signature (403), old size ≤ new size (400), old size = the size it
holds (409, `text/x.tlog.size`), equal roots at equal sizes (409), the consistency proof (422);
then it records the checkpoint and answers with its timestamped cosignature (cosignature/v1)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from app.core.ledger import merkle, notes
from app.core.ledger.notes import Checkpoint, NoteError, Verifier

MAX_BODY = 64 * 1024
MAX_PROOF = 63


class WitnessState:
    """origin → the latest cosigned checkpoint (size, base64 root, note), in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.logs: dict[str, dict[str, object]] = (
            json.loads(path.read_text()) if path.exists() else {}
        )

    def held(self, origin: str) -> tuple[int, bytes]:
        entry = self.logs.get(origin)
        if entry is None:
            return 0, b""
        return int(str(entry["size"])), base64.b64decode(str(entry["root"]))

    def record(self, checkpoint: Checkpoint, note: str) -> None:
        self.logs[checkpoint.origin] = {
            "size": checkpoint.size,
            "root": base64.b64encode(checkpoint.root).decode(),
            "note": note,
        }
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(self.logs, indent=1))
        with temp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(temp, self.path)


def parse_request(body: str) -> tuple[int, list[bytes], str]:
    """(old size, consistency proof, checkpoint note) of an add-checkpoint body."""
    head, sep, note = body.partition("\n\n")
    lines = head.split("\n")
    if not sep or not lines[0].startswith("old "):
        raise ValueError("the body starts with `old <size>`, proof lines, a blank line")
    old_text = lines[0][4:]
    if not notes.is_uint64(old_text):
        raise ValueError("the old size is a decimal below 2^64 with no leading zeros")
    if len(lines) - 1 > MAX_PROOF:
        raise ValueError("at most 63 proof lines")
    try:
        proof = [base64.b64decode(x, validate=True) for x in lines[1:]]
    except binascii.Error as exc:
        raise ValueError("a proof line is not base64") from exc
    if any(len(h) != 32 for h in proof):
        raise ValueError("a proof line is not a SHA-256 hash")
    return int(old_text), proof, note


async def bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it is known to exceed `limit` bytes: a declared
    Content-Length over it is refused before anything is read, and a streamed body is read
    only until it passes it (the whole body used to be read first, so a client with
    no key could grow the witness by hundreds of MB a request)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or len(declared) > 12):
        return None
    if declared is not None and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def create_witness_app(
    name: str, key: Ed25519PrivateKey, logs: list[Verifier], state_file: Path
) -> FastAPI:
    """The witness's HTTP service: POST /add-checkpoint, GET /vkey."""
    app = FastAPI(title="Lethe witness", docs_url=None, redoc_url=None, openapi_url=None)
    state = WitnessState(state_file)
    trusted: dict[str, list[Verifier]] = {}
    for verifier in logs:
        trusted.setdefault(verifier.name, []).append(verifier)
    me = notes.witness_verifier(name, key.public_key())

    @app.get("/vkey", response_class=PlainTextResponse)
    def vkey() -> str:
        return me.vkey + "\n"

    @app.post("/add-checkpoint")
    async def add_checkpoint(request: Request) -> Response:
        raw = await bounded_body(request, MAX_BODY)
        if raw is None:
            return PlainTextResponse("body too large\n", 413)
        try:
            old, proof, note = parse_request(raw.decode())
            text, _ = notes.split(note)
            checkpoint = Checkpoint.parse(text)
        except (ValueError, UnicodeDecodeError) as exc:
            return PlainTextResponse(f"{exc}\n", 400)
        verifiers = trusted.get(checkpoint.origin)
        if verifiers is None:
            return PlainTextResponse("unknown log origin\n", 404)
        try:
            notes.open_note(note, verifiers)
        except NoteError as exc:
            return PlainTextResponse(f"{exc}\n", 403)
        if old > checkpoint.size:
            return PlainTextResponse("old size exceeds the checkpoint size\n", 400)
        with state.lock:
            refused = _refused(state, checkpoint, old, proof)
            if refused is not None:
                return refused
            state.record(checkpoint, note)
        line = notes.cosign(text, name, key, int(time.time()))
        return PlainTextResponse(line)

    return app


def _refused(
    state: WitnessState, checkpoint: Checkpoint, old: int, proof: list[bytes]
) -> Response | None:
    """Why a checkpoint is not cosigned, against the one held for its log (C2SP
    tlog-witness): another old size (409 with the held size), a fork, a proof that fails."""
    size, root = state.held(checkpoint.origin)
    if old != size:
        return Response(f"{size}\n", 409, media_type="text/x.tlog.size")
    if old == checkpoint.size:
        if root != checkpoint.root:
            return PlainTextResponse("same size, another root: a fork\n", 409)
        return None
    if old > 0 and not merkle.verify_consistency(
        old, checkpoint.size, proof, root, checkpoint.root
    ):
        return PlainTextResponse("the consistency proof does not verify\n", 422)
    if old == 0 and proof:
        return PlainTextResponse("the proof from size 0 must be empty\n", 422)
    return None
