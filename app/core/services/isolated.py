"""Plaintext handled in a process that ends with it.

Parsing an upload makes many copies of every row (the decoded text, one string per cell,
float64 and float32 arrays) that Python frees without zeroing, so the API process kept the
rows of people long erased. Registration now runs in a child forked from a clean fork server
(`max_tasks_per_child=1`): the child reads the upload from shared memory, parses, seals and
commits, returns the dataset's id and exits, and its memory goes with it. The API process
keeps only the raw upload, which it zeroes (`wipe`) once the child has it; app/api/scrub.py
gives its free pages back to the kernel afterwards (`trim`).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import forkserver, shared_memory
from typing import Any

import pyarrow as pa

from app.core import formats, pause
from app.core.errors import APIError
from app.core.formats import dataset_files
from app.core.formats.s3 import open_object, read_whole
from app.core.phases import Phases
from app.core.schemas import BuiltinDatasetIn, ObjectSource
from app.core.settings import Settings

_PRELOAD = [
    "app.core.no_interrupt",  # first: a Ctrl-C while the rest import does not reach it
    "app.core.services.isolated",
    "app.core.services.registration",
    "app.core.services.appends",
    "app.core.formats",
    "app.core.formats.dataset_files",
    "app.core.formats.parquet_files",
    # the seeded split of an upload with no split column (`seeded_split`): every such parse
    # imported it in its child, on a registration's POST, and held it in its memory
    "sklearn.model_selection",
    # not scikit-learn's dataset loaders: preloaded, they were 6 MiB of every child's memory,
    # which a million-row registration needs under its bound; a builtin's
    # child imports them itself
]
_BYTES_DATA = bytes.__basicsize__ - 1  # where a bytes object's data starts (CPython)


@dataclass(frozen=True)
class Registration:
    """What the child needs: the settings (its keys and database), the upload's name, its
    format and that format's checked options (and the object it is read from, if any), or a
    builtin spec."""

    settings: Settings
    dataset_id: int  # the row `registration.begin` made
    name: str
    fmt: str  # a name of app/core/formats, or builtin
    limits: dataset_files.Limits
    options: formats.Options = field(default_factory=formats.Options)
    source: ObjectSource | None = None  # read from object storage (else the upload's bytes)
    builtin: BuiltinDatasetIn | None = None
    on_erased: str = "refuse"  # rows of erased samples or people: refuse, or skip them
    append_id: int | None = None  # rows appended to `dataset_id` by this append


def start_isolated(pool: UploadPool, job: Registration, data: bytes) -> Future[tuple[Any, ...]]:
    """Register in a child process; its outcome (`outcome` reads it). The upload crosses in
    shared memory, and `data` is wiped as soon as the child can read it; where /dev/shm is too
    small for it (a container's default 64 MB), it crosses the pipe. The segment is zeroed
    and removed once the child is done, whether or not anyone still waits for it."""
    if not _fits_in_shared_memory(len(data)):
        return pool.executor().submit(_register, job, None, data)
    memory = shared_memory.SharedMemory(create=True, size=max(1, len(data)))
    buffer = _buffer(memory)
    buffer[: len(data)] = data
    wipe(data)

    def cleanup(_: object = None) -> None:  # runs before the callbacks that answer and signal
        zero(buffer)
        buffer.release()
        memory.close()
        memory.unlink()

    try:
        future = pool.executor().submit(_register, job, memory.name, len(data))
    except BaseException:
        cleanup()
        raise
    future.add_done_callback(cleanup)
    return future


def outcome(result: tuple[Any, ...]) -> int:
    """The dataset's id, or the child's APIError raised here."""
    return _outcome(result)


def _outcome(outcome: tuple[Any, ...]) -> int:
    if outcome[0] == "error":
        _, status, code, message, details = outcome
        raise APIError(status, code, message, details)
    return int(outcome[1])


def _fits_in_shared_memory(size: int) -> bool:
    try:
        found = os.statvfs("/dev/shm")
    except OSError:
        return False
    return size + (1 << 20) < found.f_bavail * found.f_frsize


def _register(job: Registration, name: str | None, payload: bytes | int) -> tuple[Any, ...]:
    """In the child: parse, check, register; an APIError comes back as a tuple. The upload
    is in the shared-memory segment `name` (`payload` its size), or is `payload` itself."""
    from app.core.runtime import Runtime
    from app.core.services import registration

    phases = Phases()  # an append's log line says where its time went
    if name is None:
        assert isinstance(payload, bytes)
        data = payload
    else:
        memory = shared_memory.SharedMemory(name=name)
        try:
            buffer = _buffer(memory)
            data = bytes(buffer[: int(payload)])
            buffer.release()
        finally:
            memory.close()
    _large_blocks_returned()
    runtime = Runtime.build(job.settings)
    if job.append_id is not None:
        phases.mark("start")  # the upload read from shared memory, the runtime built
        return _append(runtime, job, data, phases)
    try:
        pause.point(job.settings, "registration-parse", job.dataset_id)  # tests: before a row
        parsed = _parse(job, data)
        dataset_files.check_size(len(parsed.y), 1, dataset_files.Limits.from_settings(job.settings))
        fraction = job.builtin.test_fraction if job.builtin else job.options.test_fraction
        dataset_id = registration.register(
            runtime, job.dataset_id, parsed, job.on_erased, fraction or 0.2
        )
        return ("ok", dataset_id)
    except APIError as exc:  # the dataset says so, for a client answered 202 already
        registration.discard(runtime, job.dataset_id, exc.as_json())
        return ("error", exc.status, exc.code, exc.message, exc.details)
    except Exception as exc:
        registration.discard(runtime, job.dataset_id, registration.failure(exc))
        raise


def _append(runtime: Any, job: Registration, data: bytes, phases: Phases) -> tuple[Any, ...]:
    """In the child: parse and append (app/core/services/appends.py); ("ok", append id)."""
    from app.core.services import appends

    assert job.append_id is not None
    try:
        # no seeded split: a row's split is its column's or the dataset's rule (`append`)
        parsed = _parse(replace(job, options=job.options.model_copy(update={"seed": None})), data)
        dataset_files.check_size(len(parsed.y), 1, dataset_files.Limits.from_settings(job.settings))
        split_given = job.options.split_given(data)
        phases.mark("parse")
        appends.append(runtime, job.append_id, parsed, job.on_erased, split_given, phases)
        return ("ok", job.append_id)
    except APIError as exc:
        appends.discard(runtime, job.append_id, exc.as_json())
        return ("error", exc.status, exc.code, exc.message, exc.details)
    except Exception as exc:
        appends.discard(runtime, job.append_id, appends.failure(exc))
        raise


def _buffer(memory: shared_memory.SharedMemory) -> memoryview:
    buffer = memory.buf
    assert buffer is not None, "an open segment has a buffer"
    return buffer


def _parse(job: Registration, data: bytes) -> dataset_files.ParsedDataset:
    """The rows, by the job's format (app/core/formats), from the upload or the object."""
    if job.builtin is not None:
        return dataset_files.streamed_builtin(job.builtin)
    fmt = formats.format_named(job.fmt)
    if job.source is None:
        return fmt.parse(data, job.options, job.limits)
    found = open_object(job.settings, job.source.s3.bucket, job.source.s3.key)
    if fmt.ranged:  # a part at a time, by ranged GETs
        return fmt.parse(found, job.options, job.limits)
    return fmt.parse(read_whole(found, job.limits.max_npz_bytes), job.options, job.limits)


class UploadPool:
    """One service's pool of upload parsers (a Runtime holds it): one child per registration,
    forked from a fork server that never held an upload, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(_PRELOAD)
                self._executor = ProcessPoolExecutor(
                    max_workers=2,
                    mp_context=context,
                    max_tasks_per_child=1,
                    initializer=_exit_with,
                    initargs=(os.getpid(),),
                )
            return self._executor

    def warm_up(self) -> None:
        """Start the fork server now (it imports the parsing modules once, in its own
        process), so the first upload does not wait for it. Started with SIGINT ignored, which
        it keeps across its exec: a terminal's Ctrl-C reaches the whole process group, and
        the server stops it itself (only the main thread may set a handler)."""
        self.executor()
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            with contextlib.suppress(Exception):
                forkserver.ensure_running()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def shut_down(self) -> None:
        """At a clean stop: the pool's idle workers leave now, and with them the fork
        server."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


PARENT_CHECK_SECONDS = 1.0


def _exit_with(api_pid: int) -> None:
    """In a pool worker: exit once the API process is gone. A worker waiting for its next
    upload never sees its queue close (it holds the queue's other end itself), and it holds
    the fork server's liveness pipe: without this, a stopped or killed API left its fork
    server and an idle worker behind for good (~220 MB each; the test suite piled them up).
    Its log lines (an append's phases) go to the API's log, marked as the worker's are."""
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s:     [upload] %(name)s: %(message)s"
    )

    def watch() -> None:
        try:  # told the moment the API exits (Linux 5.3+): not a second later, not after
            gone = os.pidfd_open(api_pid)  # its reaping (a killed API's zombie still answers)
        except (AttributeError, OSError):
            gone = None
        if gone is not None:
            select.select([gone], [], [])
            os._exit(0)
        while True:
            time.sleep(PARENT_CHECK_SECONDS)
            try:
                os.kill(api_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # a pid reused by another user's process: ours is gone
                os._exit(0)

    threading.Thread(target=watch, name="lethe-parent-watch", daemon=True).start()


def zero(buffer: memoryview) -> None:
    """Zero a writable buffer in place with one memset: assigning it a zeroed bytes of its size
    allocated and copied that too, on the path of the POST's answer and the learning's
    signal."""
    if not len(buffer):
        return
    view = ctypes.c_char.from_buffer(buffer)
    try:
        ctypes.memset(ctypes.addressof(view), 0, len(buffer))
    finally:
        del view  # the export ends: the buffer can be released


def wipe(data: bytes) -> None:
    """Zero a bytes object's contents in place (CPython): plaintext this process read, about
    to be freed. Objects of one byte or none are shared singletons and are left alone."""
    if len(data) > 1:
        ctypes.memset(id(data) + _BYTES_DATA, 0, len(data))


def wipe_upload(file: Any) -> None:
    """Zero a spooled upload (its in-memory buffer, or the bytes of its temporary file)."""
    inner = getattr(file, "_file", file)
    if isinstance(inner, io.BytesIO):
        view = inner.getbuffer()
        view[:] = bytes(len(view))
        view.release()
        return
    try:
        size = inner.seek(0, io.SEEK_END)
        inner.seek(0)
        for _ in range(0, size, 1 << 20):
            inner.write(bytes(min(1 << 20, size - inner.tell())))
        inner.flush()
    except (OSError, ValueError):
        pass


M_PERTURB = -6  # glibc mallopt(3)
FREED_BYTE = 0xA5


def scrub_freed() -> bool:
    """Have glibc overwrite every block it frees (`mallopt(M_PERTURB)`), so the buffers a
    request passed through (the server's socket reads, a response's JSON) do not keep an
    erased person's ids in free memory. Blocks the allocator caches per thread
    (≤ 1 KiB) and Python's small-object pools are not covered. False where not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_PERTURB, FREED_BYTE))
    except (OSError, AttributeError):
        return False


M_MMAP_THRESHOLD = -3  # glibc mallopt(3)


def _large_blocks_returned() -> None:
    """In a registration's child: every block of 4 MiB or more is its own mapping, given back
    to the kernel when freed. glibc raises its threshold after the first large free, and the
    row groups decoded one after another then stayed in the heap (peak RSS). Arrow
    allocates from glibc too: its own pool (mimalloc) kept 48 MB of decoded batches after
    `release_unused`."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 4 * 2**20)
    pa.set_memory_pool(pa.system_memory_pool())


def trim() -> None:
    """Give the allocator's free pages back to the kernel (glibc `malloc_trim`), which zeroes
    them before any other use (app/api/scrub.py runs it after an upload)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
