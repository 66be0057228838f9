"""Embedded mode's worker as a child process (the default of `lethe serve`).

As a thread of the API process the worker's Python work took the interpreter lock from the
request path: under a stream of POSTs no update committed at all. As a spawned process (no
external server) it has an interpreter of its own. The database stays the record, as with
RQ: a signal lost with a dead child is sent again by the reconciler, and a child that dies is
started again. One pipe carries signals in and "taken", wake-ups and metrics out; its child
side is workers/embedded.py, named by dotted path because `app` never imports `workers`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from app.core.settings import Settings
from app.core.signals import WaitingSignals
from app.core.wakeups import FINISHED

log = logging.getLogger("lethe.dispatch")

CHILD = "workers.embedded.main"
RESTART_SECONDS = 1.0  # a child that died is started again after this pause
STOP_SECONDS = 30.0  # how long a stopping child may take to put its job's work back
METRICS_SECONDS = 2.0  # how long a scrape waits for the child's counters


def _run(entry: str, *args: object) -> None:
    """The child's first call: import its entry point there, by dotted path. A terminal's
    Ctrl-C reaches the whole process group: the child ignores it from its first line (the API
    stops it), so it prints no traceback (`_spawn` starts it with SIGINT ignored already)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    module, name = entry.rsplit(".", 1)
    getattr(importlib.import_module(module), name)(*args)


class ProcessDispatcher:
    """Starts, feeds, restarts and stops the embedded worker process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._send_lock = threading.Lock()
        self._waiting = WaitingSignals()
        self._conn: Connection | None = None
        self._process: BaseProcess | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._metrics_lock = threading.Lock()
        self._metrics_seq = 0
        self._metrics_reply: tuple[int, bytes] | None = None
        self._metrics_ready = threading.Condition()
        self.starts = 0  # how many children were started (a restart counts)
        self.recycled = 0  # how many gave way after an erasure (workers/recycle.py)
        self._recycling = False
        self._warm: tuple[int, ...] = ()  # the models the one that gave way held
        self._handed: bytes | None = None  # and their method states (workers/handover.py)

    def start(self) -> None:
        self._stopping.clear()
        self._spawn()
        self._supervisor = threading.Thread(
            target=self._supervise, name="lethe-worker-process", daemon=True
        )
        self._supervisor.start()

    def stop(self) -> None:
        """Ask the child to stop: its running job puts its work back (app/core/shutdown.py). The
        pipe's "stop" is read once the child listens, so it gets SIGTERM too: a child that
        has not yet installed its handler (still importing torch: seconds, more on a busy
        machine) holds no job and ends at once, where it used to finish starting first and
        a server stopped right after its start took more than STOP_SECONDS to exit; a child
        that has takes SIGTERM as its "stop" (workers/embedded.py)."""
        self._stopping.set()
        self._send(("stop",))
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):  # gone already
                process.terminate()
            process.join(STOP_SECONDS)
            if process.is_alive():
                log.warning("the worker process did not stop in %.0f s; killing it", STOP_SECONDS)
                process.kill()
                process.join(5)
        if self._supervisor is not None:
            self._supervisor.join(5)

    def enqueue(self, job: str, *args: int) -> None:
        if self._waiting.add((job, args)):  # else already waiting: one run sees all the work
            self._send(("job", job, args))

    def expect(self) -> None:
        """Tell the child that a job is coming soon: its idle collection waits meanwhile."""
        self._send(("soon",))

    def ping(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def depth(self) -> int:
        return len(self._waiting)

    @property
    def pid(self) -> int | None:
        """The worker process's pid (None before the first start)."""
        return self._process.pid if self._process is not None else None

    def metrics(self) -> bytes:
        """The child's worker counters in Prometheus text (empty if it does not answer)."""
        with self._metrics_lock:
            self._metrics_seq += 1
            seq = self._metrics_seq
            if not self._send(("metrics", seq)):
                return b""
            with self._metrics_ready:
                self._metrics_ready.wait_for(
                    lambda: self._metrics_reply is not None and self._metrics_reply[0] == seq,
                    METRICS_SECONDS,
                )
                reply, self._metrics_reply = self._metrics_reply, None
            return reply[1] if reply is not None and reply[0] == seq else b""

    def _send(self, message: tuple[object, ...]) -> bool:
        """Send to the child; False if it is gone (its signals stay pending for the next)."""
        with self._send_lock:
            if self._conn is None:
                return False
            try:
                self._conn.send(message)
                return True
            except OSError:
                return False

    def _spawn(self) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        ours, theirs = context.Pipe(duplex=True)
        warm, handed, self._warm, self._handed = self._warm, self._handed, (), None
        process = context.Process(
            target=_run,
            args=(CHILD, self.settings, theirs, os.getpid(), warm, handed),
            name="lethe-worker",
        )
        process.daemon = True
        # an ignored signal stays ignored across the child's exec, and Python then installs no
        # KeyboardInterrupt of its own: a Ctrl-C while the child boots does not reach it
        # (only the main thread may set a handler: a restart by the supervisor relies on _run)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            process.start()
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        theirs.close()  # the child holds its end: its death is our end-of-file
        with self._send_lock:
            self._conn, self._process = ours, process
        self.starts += 1
        for job, args in self._waiting.all():  # signals a dead child never took
            self._send(("job", job, args))

    def _supervise(self) -> None:
        """Handle the child's messages; start a new child if it dies unasked."""
        while True:
            conn = self._conn
            assert conn is not None
            self._read(conn)
            if self._stopping.is_set():
                return
            process = self._process
            if self._recycling:  # it gave way after an erasure: its successor at once
                self._recycling = False
                if process is not None:
                    process.join(STOP_SECONDS)
                self.recycled += 1
                log.info("the worker process gave way after an erasure; starting a fresh one")
            else:
                code = process.exitcode if process is not None else None
                log.error("the worker process exited (%s); starting another", code)
                if self._stopping.wait(RESTART_SECONDS):
                    return
            if self._stopping.is_set():
                return
            self._spawn()

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                with self._send_lock:
                    if self._conn is conn:
                        self._conn = None
                conn.close()
                return
            kind = message[0]
            if kind == "taken":
                self._waiting.taken((message[1], tuple(message[2])))
            elif kind == "wake":
                FINISHED.wake()
            elif kind == "recycle":
                self._recycling, self._warm = True, tuple(message[1])
                self._handed = message[2] if len(message) > 2 else None
            elif kind == "metrics":
                with self._metrics_ready:
                    self._metrics_reply = (message[1], message[2])
                    self._metrics_ready.notify_all()
