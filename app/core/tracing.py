"""Traces: one deletion is one trace from its POST to its certificate,
across the API process, the queue and the worker process, in OpenTelemetry.

Lethe calls only OpenTelemetry's API, which does nothing until a tracer provider is set:
`configure` sets one (the SDK, exporting by OTLP over HTTP) when
`OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`) is set, and nothing when not. The
context crosses the queue on the request's own row (`deletion_requests.trace_context`, a W3C
`traceparent`): a queue signal stands for a model, not a request (one signal wakes a batch of
many), and the row reaches whichever worker takes the request, in any process, after any
restart. No span attribute carries a sample's or a subject's id, or a value of the data: the
HTTP spans' URLs lose their query strings (`?subject=` is one), and SQL spans carry the
statement with its placeholders, never its parameters."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context, propagate, trace

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.trace import Span

log = logging.getLogger("lethe.tracing")
tracer = trace.get_tracer("lethe")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_configured = threading.Event()


def enabled() -> bool:
    """Whether this process records spans (`configure` set the SDK up)."""
    return _configured.is_set()


def _recording() -> bool:
    """Whether the current trace is recorded: configured, and the current span sampled (an
    unsampled request's steps make no spans at all, rather than non-recording ones)."""
    return _configured.is_set() and trace.get_current_span().is_recording()


def wanted() -> bool:
    """Whether this process exports traces (an OTLP endpoint is configured)."""
    return any(os.environ.get(v) for v in ENDPOINT_VARIABLES)


def configure(service: str, sql: bool = True) -> bool:
    """Set the SDK's tracer provider, exporting to the OTLP endpoint in batches, and (`sql`)
    instrument SQLAlchemy's engines made from now on; once per process. False (and nothing
    set) when no endpoint is configured."""
    if not wanted() or _configured.is_set():
        return _configured.is_set()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry's SDK is not installed: "
            "pip install 'lethe-unlearning[tracing]'"
        ) from exc

    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    # it declares SQLAlchemy < 2.1; its engine events are the same in 2.1
    # (tests/integration/test_tracing.py sees its spans), so its version check is skipped
    if sql:
        SQLAlchemyInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    atexit.register(provider.shutdown)  # what is still batched leaves at a clean exit
    _configured.set()
    log.info("exporting traces to %s as %s", os.environ.get(ENDPOINT_VARIABLES[0]), name)
    return True


def flush() -> None:
    """Export what is batched now (a process about to end without running atexit)."""
    if _configured.is_set():
        provider: Any = trace.get_tracer_provider()
        provider.force_flush()


def instrument_app(app: FastAPI) -> None:
    """The API's server spans (OpenTelemetry's ASGI middleware), with URLs stripped of their
    query strings. The span is named by the method when it starts, and a sampled one takes
    its route's template (`RouteName`): FastAPI's own instrumentation matched every request
    against all of Lethe's routes to name its span, sampled or not, which was most of a
    millisecond of the API's CPU per POST."""
    if not _configured.is_set():
        return
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.util.http import parse_excluded_urls

    stack = app.build_middleware_stack

    def build() -> Any:
        traced = OpenTelemetryMiddleware(
            RouteName(stack()),
            excluded_urls=parse_excluded_urls("healthz,metrics"),
            default_span_details=_by_method,
            server_request_hook=_without_query,
            exclude_spans=["receive", "send"],
        )
        return FreshContext(traced)  # outside even the instrumentation's wrapper

    app.build_middleware_stack = build  # type: ignore[method-assign]


def _by_method(scope: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """A server span's first name: its method (the route is not known before routing)."""
    return str(scope.get("method") or "HTTP"), {}


class RouteName:
    """Inside the server span: a recorded span takes the matched route's template as its
    name and `http.route` (`POST /v1/deletions/{request_id}`: low cardinality, no id),
    matched by the FastAPI instrumentation's own lookup, for sampled requests only."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        span = trace.get_current_span()
        if span.is_recording() and scope.get("type") == "http":
            from opentelemetry.instrumentation.fastapi import _get_route_details

            template = _get_route_details(scope)
            if template:
                span.update_name(f"{scope.get('method', 'HTTP')} {template}")
                span.set_attribute("http.route", template)
        await self.app(scope, receive, send)


class FreshContext:
    """Each request starts from an empty context, so its server span is a root unless the
    request carries a `traceparent`. Without it, the request after an upload on the same
    keep-alive connection became a child of the upload's span (a context left attached in
    the connection's callbacks, which every later request's task copies)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        token = context.attach(context.Context())
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)


def _without_query(span: Span, scope: Mapping[str, Any]) -> None:
    """Overwrite the URL attributes the instrumentation took from the request with the path
    alone: a query string may name a subject."""
    if not span.is_recording():
        return
    path = str(scope.get("path", ""))
    for key in ("http.target", "url.path"):
        span.set_attribute(key, path)
    for key in ("http.url", "url.full"):
        span.set_attribute(key, path)
    span.set_attribute("url.query", "")


def carrier() -> str | None:
    """The current span's context as a W3C `traceparent` (None when not tracing, or when this
    trace is not sampled: the worker then makes no span for it)."""
    if not _recording():
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers.get("traceparent")


def _context_of(traceparent: str | None) -> context.Context | None:
    return propagate.extract({"traceparent": traceparent}) if traceparent else None


def _nanos(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


@contextmanager
def batch_trace(
    requests: list[tuple[int, str | None, datetime]], attributes: Mapping[str, Any]
) -> Iterator[None]:
    """The worker's side of a batch's trace: (request id, traceparent, committed at) per
    request. The first traced request's trace is the parent (a batch of several links the
    others): `deletion.queue_wait` from its commit to now, then `deletion.update` around the
    block, whose own steps are `span`s. Nothing when not tracing."""
    traced = [(i, c, at) for i, c, at in requests if c]
    if not _configured.is_set() or not traced:
        yield
        return
    _, first, committed = traced[0]
    parent = _context_of(first)
    links = [
        trace.Link(trace.get_current_span(ctx).get_span_context())
        for _, c, _ in traced[1:]
        if (ctx := _context_of(c)) is not None
    ]
    wait = tracer.start_span(
        "deletion.queue_wait", context=parent, start_time=_nanos(committed), links=links
    )
    wait.set_attribute("lethe.requests", len(requests))
    wait.end()
    with tracer.start_as_current_span(
        "deletion.update", context=parent, links=links, attributes=dict(attributes)
    ):
        yield


def record(name: str, start_ns: int, until: datetime | None) -> None:
    """A span of the current context that already happened: from `start_ns` to `until`
    (now when None; never before its start)."""
    if not _recording():
        return
    end = max(start_ns, _nanos(until) if until is not None else time.time_ns())
    tracer.start_span(name, start_time=start_ns).end(end_time=end)


def request_started_ns() -> int:
    """When the current request's server span began (now when not tracing): a step that
    counts the request's own arrival, routing and schema validation starts there."""
    began = getattr(trace.get_current_span(), "start_time", None)
    return int(began) if began else time.time_ns()


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A child of the current span (no cost beyond a call when not tracing or not sampled)."""
    if not _recording():
        yield
        return
    with tracer.start_as_current_span(name, attributes=attributes or None):
        yield


def current() -> context.Context:
    """The current context, to carry into another thread (`attached`)."""
    return context.get_current()


@contextmanager
def attached(ctx: context.Context) -> Iterator[None]:
    """Run the block in `ctx` (a thread pool's thread does not inherit its caller's)."""
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)
