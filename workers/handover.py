"""What a worker process hands its successor when it gives way after an erasure
(workers/recycle.py): each resident session's method state, never its rows.

The successor warms the sessions its predecessor held (workers/load.warm_session): it reads
the retained rows itself, and with a handed-over state it skips the method's `prepare`
(convex_head's anchored Hessians: a Hessian pass, a quarter of a million-row session's
warm-up, during which the next deletion waited). What travels is the
method's own aggregate (the Hessians, the second moment, the gradient and its bound, at the
current version), as one safetensors buffer: through the pipe to the API process and the
spawn arguments (embedded mode), or through an anonymous memory file across the re-execution
(`lethe worker`). No freed memory of the predecessor travels, and nothing reaches a disk.
A state is used only where it describes the version the successor loaded; else the method
prepares anew, as it did before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import MutableMapping

import torch
from sqlalchemy import select

from app.core.db.tables import Dataset, Model
from methods.compute import method_for
from workers import tensorfile
from workers.context import JobContext
from workers.data import database_key
from workers.load import model_spec
from workers.resident import HandedState

log = logging.getLogger("lethe.handover")

FD_ENV = "LETHE_HANDOVER_FD"  # `lethe worker` across its re-execution: the memory file's fd


def exported(ctx: JobContext) -> bytes | None:
    """The method states of every session this process holds, as one safetensors buffer
    (None: none to hand over). Tensor names are `<model id>/<name>`; the metadata maps each
    model to the version its state describes."""
    sessions, where = ctx.resident_sessions(), database_key(ctx.db.engine)
    held = {m: s for m in sessions.models(where) if (s := sessions.peek(where, m)) is not None}
    tensors: dict[str, torch.Tensor] = {}
    versions: dict[str, int] = {}
    with ctx.db.read() as session:
        for model_id, made in held.items():
            if made.method_state is None:
                continue
            found = session.execute(
                select(Model, Dataset)
                .join(Dataset, Dataset.id == Model.dataset_id)
                .where(Model.id == model_id)
            ).first()
            if found is None:
                continue
            spec = model_spec(*found)
            state = method_for(spec.method.name, spec).export_resident(made.method_state)
            if state is None:
                continue
            versions[str(model_id)] = made.version_id
            tensors |= {f"{model_id}/{name}": t.contiguous() for name, t in state.items()}
    if not tensors:
        return None
    return tensorfile.encode_bytes(tensors, {"versions": json.dumps(versions)})


def exported_or_none(ctx: JobContext) -> bytes | None:
    """`exported`, or None where it fails: a hand-over never keeps a process from giving way
    (its successor prepares anew, as before)."""
    try:
        return exported(ctx)
    except Exception:  # noqa: BLE001 - a cache: the successor prepares what is missing
        log.warning(
            "could not export the resident states; the successor prepares them", exc_info=True
        )
        return None


def parsed(data: bytes | None) -> dict[int, HandedState]:
    """`exported`'s buffer by model (empty for None or a buffer that does not parse: the
    successor then prepares every session anew)."""
    if not data:
        return {}
    try:
        buffer = bytearray(data)
        versions = json.loads(tensorfile.metadata(buffer).get("versions", "{}"))
        tensors = tensorfile.decode(buffer)
        out: dict[int, HandedState] = {}
        for model, version_id in versions.items():
            prefix = f"{model}/"
            mine = {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
            out[int(model)] = HandedState(int(version_id), mine)
        return out
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("the predecessor's resident states did not parse; preparing anew")
        return {}


def to_memory_file(data: bytes) -> int | None:
    """`data` in an anonymous memory file that a re-executed process inherits: its fd (None
    where the platform has none)."""
    if not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("lethe-handover", 0)  # no MFD_CLOEXEC: it survives the exec
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return fd


def from_memory_file(environ: MutableMapping[str, str]) -> bytes | None:
    """The buffer a predecessor left in the memory file named by FD_ENV, read and closed."""
    named = environ.pop(FD_ENV, None)
    if not named:
        return None
    try:
        fd = int(named)
    except ValueError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
