"""An OTLP/HTTP trace receiver for the tests: what a collector would get from
Lethe's exporters, decoded with OpenTelemetry's own protobuf classes."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


class OtlpReceiver:
    """POST /v1/traces on a loopback port; every span received, in order."""

    def __init__(self, port: int, decode: bool = True) -> None:
        self.port, self.decode = port, decode
        self.received_bytes = 0
        self.endpoint = f"http://127.0.0.1:{port}"
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.received_bytes += len(body)
                if receiver.decode:  # a bench counts bytes only: its CPU is the service's
                    if self.headers.get("content-encoding") == "gzip":
                        body = gzip.decompress(body)
                    receiver._take(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope in resource.scope_spans:
                for s in scope.spans:
                    got.append(
                        Span(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self._lock:
            self.spans += got

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, what: str, check: Any, timeout: float = 120.0) -> Any:
        """`check(spans)` until truthy: spans arrive in the exporters' batches."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            got = check(spans)
            if got:
                return got
            names = sorted({(s.service, s.name) for s in spans})
            assert time.monotonic() < deadline, f"timed out waiting for {what}; got {names}"
            time.sleep(0.1)
