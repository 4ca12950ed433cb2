"""A request's trace: one server span, one client span per upstream attempt (and per fan-out part).

The flow calls these at fixed points: the handler opens a :class:`RequestTrace` (``Tracing.start``),
the service opens an :class:`AttemptTrace` per attempt and hands it to the backend inside the
``Call`` (its ``headers`` go upstream), the record's close ends the request. No OpenTelemetry
here and no contextvars: a span is plain data until it ends, then one :class:`Finished` goes to
the exporter (``gateway.tracing.sdk``), which builds the SDK's span in its own thread.

An unsampled request has the same objects with ``sampled`` false: they hold the ids its
``traceparent`` headers need and record nothing.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from random import getrandbits
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

import gateway.tracing.attributes as attrs_of
from gateway.tracing.w3c import Parent, Sampler, parse_traceparent

if TYPE_CHECKING:
    from backends.base import Backend, TokenUsage
    from schemas.endpoints import Endpoint

__all__ = ["TRACE_KEY", "AttemptTrace", "Finished", "RequestTrace", "Tracing"]

_time_ns = time.time_ns


class Finished:
    """One ended span, as the exporter takes it (plain data; the SDK span is built in the exporter thread)."""

    __slots__ = (
        "attributes", "end", "error", "kind", "name", "parent_id", "parent_remote", "span_id", "start", "trace_id",
        "tracestate",
    )  # fmt: skip

    def __init__(
        self,
        name: str,
        kind: str,
        trace_id: int,
        span_id: int,
        parent_id: int | None,
        parent_remote: bool,
        tracestate: str | None,
        start: int,
        end: int,
        attributes: dict[str, Any],
        error: str | None,
    ) -> None:
        self.name, self.kind = name, kind  # kind: "server" or "client"
        self.trace_id, self.span_id, self.parent_id, self.parent_remote = trace_id, span_id, parent_id, parent_remote
        self.tracestate = tracestate
        self.start, self.end = start, end  # ns since the epoch
        self.attributes = attributes
        self.error = error  # None: status unset; otherwise the status description (an error)


Sink = Callable[[Finished], None]


class Tracing:
    """Tracing for one gateway process: the sampler, the exporter's sink, what every span shares."""

    def __init__(self, sampler: Sampler, sink: Sink, *, capture_content: bool = False) -> None:
        self.sampler = sampler
        self.sink = sink
        self.capture_content = capture_content
        # backend -> (server.address, server.port); weak: a backend a reload replaced is not kept
        self._servers: weakref.WeakKeyDictionary[Backend, tuple[str, int] | None] = weakref.WeakKeyDictionary()
        # Whether each request keeps its trace for the access line (gateway.tracing.access_log), set
        # when that logger is installed: otherwise nothing reads it.
        self.keyed = False

    def start(self, request: web.Request, endpoint: Endpoint) -> RequestTrace:
        """The trace of ``request``: continues its ``traceparent`` or starts one; sampled or not."""
        headers = request.headers
        value = headers.get("traceparent")
        parent = parse_traceparent(value, headers.get("tracestate")) if value is not None else None
        sampled, trace_id = self.sampler.sampled(parent)
        trace = RequestTrace(self, request, endpoint, parent, sampled, trace_id)
        if self.keyed:
            request[TRACE_KEY] = trace  # the access line names it (gateway.tracing.access_log)
        return trace

    def server_of(self, backend: Backend) -> tuple[str, int] | None:
        """``server.address`` and ``server.port`` of a backend's upstream (from its ``base_url``), cached."""
        if backend in self._servers:
            return self._servers[backend]
        server = None
        url = getattr(backend, "base_url", None)
        if isinstance(url, str):
            parts = urlsplit(url)
            if parts.hostname:
                server = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        self._servers[backend] = server
        return server


class RequestTrace:
    """A request's server span. ``trace_id``/``span_id`` are what logs carry; ``sampled``: recorded."""

    __slots__ = (
        "_http", "_ttfc", "attempt_count", "backend_kind", "endpoint", "finish_reasons", "last", "output",
        "parent", "prefix", "request", "response_attrs", "sampled", "span_id", "start_ns", "stream_error", "suffix",
        "trace_id", "tracing",
    )  # fmt: skip

    def __init__(
        self,
        tracing: Tracing,
        request: web.Request,
        endpoint: Endpoint,
        parent: Parent | None,
        sampled: bool,
        trace_id: int,
    ) -> None:
        self.tracing = tracing
        self.endpoint = endpoint
        self.parent = parent
        self.sampled = sampled
        self.trace_id = trace_id
        # Every traceparent this request sends is prefix + a span id + suffix: the trace id is formatted once.
        self.prefix = f"00-{trace_id:032x}-"
        self.suffix = "-01" if sampled else "-00"
        self.span_id = getrandbits(64) or 1  # zero is invalid
        self.start_ns = _time_ns() if sampled else 0  # an unsampled span is never timed
        self.request: Any = None  # the validated request, once parsed
        self.attempt_count = 0
        self.last: AttemptTrace | None = None  # the latest attempt (the one that answered, if any)
        self.backend_kind: str | None = None
        self.stream_error: BaseException | None = None
        self.finish_reasons: list[str] | None = None  # streams: collected chunk by chunk
        self.output: list[bytes] | None = None  # streams with capture_content: the chunks
        self.response_attrs: dict[str, Any] | None = None
        self._ttfc: float | None = None
        self._http = request if sampled else None  # read at the end, for a recorded request only

    @property
    def ids(self) -> tuple[str, str]:
        """``(trace_id, span_id)`` in hex, as logs and W3C headers write them."""
        return self.prefix[3:35], f"{self.span_id:016x}"

    def attempt(self, backend: Backend, upstream_model: str, retry: bool) -> AttemptTrace:
        """A client span for one attempt at ``backend``: the request's first, a failover, or (``retry``) a
        retry of a backend after a backoff."""
        number = self.attempt_count
        self.attempt_count = number + 1
        why = "retry" if retry else "failover" if number else "first"
        self.backend_kind = backend.kind
        attempt = AttemptTrace(self, self.span_id, backend, upstream_model, number, why)
        self.last = attempt
        return attempt

    def first_chunk(self) -> None:
        """A stream's first chunk is in hand: time to first chunk, for this span and the attempt's."""
        if not self.sampled:
            return
        now = _time_ns()
        self._ttfc = (now - self.start_ns) / 1e9
        last = self.last
        if last is not None:
            last.ttfc = (now - last.start) / 1e9

    def chunk(self, data: bytes) -> None:
        """A stream chunk on its way to the client (called only while recorded)."""
        reasons = attrs_of.finish_reasons_in(data)
        if reasons:
            if self.finish_reasons is None:
                self.finish_reasons = reasons
            else:
                self.finish_reasons.extend(reasons)
        if self.output is not None:
            self.output.append(data)

    def answered(self, body: bytes) -> None:
        """A whole (non-stream) answer: its id, finish reasons and, opted in, its content."""
        if self.sampled:
            self.response_attrs = {}
            attrs_of.response_attributes(body, self.response_attrs, capture=self.tracing.capture_content)

    def end(self, status: int, usage: TokenUsage | None, error: BaseException | None) -> None:
        """The request is answered (``status`` as the client saw it): the server span ends here, once.
        Called for every request, sampled or not: it also lets go of the request's last attempt."""
        last = self.last
        # An attempt holds its request and the request its last attempt: a reference cycle, which would
        # keep both, the validated request and (sampled) the aiohttp request alive until the collector
        # runs, and make it run (~8 ms each at c=64, bench/request_cost.py). Broken here, every request's
        # objects are freed by reference counting as soon as the request is done.
        self.last = None
        if last is not None and not last.ended:
            last.end(error)  # a stream's attempt ends with it at the latest
        if not self.sampled:
            return
        tracing = self.tracing
        op = attrs_of.OPERATIONS.get(self.endpoint.value, self.endpoint.value)
        http = self._http
        assert http is not None
        method, path, scheme, host, agent = (
            http.method,
            http.path,
            http.scheme,
            http.host,
            http.headers.get("User-Agent"),
        )
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "http.request.method": method,
            "http.route": path,
            "url.path": path,
            "url.scheme": scheme,
            "http.response.status_code": status,
        }
        api_type = attrs_of.API_TYPES.get(self.endpoint.value)
        if api_type is not None:
            attrs["openai.api.type"] = api_type
        address, _, port = host.rpartition(":")
        if address and port.isdigit():
            attrs["server.address"], attrs["server.port"] = address, int(port)
        elif host:
            attrs["server.address"] = host
        if agent:
            attrs["user_agent.original"] = agent[:256]
        request = self.request
        model = ""
        if request is not None:
            attrs_of.request_attributes(request, attrs)
            model = attrs.get("gen_ai.request.model", "")
            if tracing.capture_content:
                messages = attrs_of.input_messages(request)
                if messages is not None:
                    attrs["gen_ai.input.messages"] = messages
                tools = attrs_of.tool_definitions(request)
                if tools is not None:
                    attrs["gen_ai.tool.definitions"] = tools
        if self.backend_kind is not None:
            attrs["gen_ai.provider.name"] = attrs_of.PROVIDERS.get(self.backend_kind, self.backend_kind)
        if last is not None:
            attrs["gen_ai.response.model"] = last.upstream_model
            attrs["gateway.backend.name"] = last.backend.name
            attrs["gateway.attempts"] = self.attempt_count
        if usage is not None:
            attrs["gen_ai.usage.input_tokens"] = usage.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = usage.completion_tokens
        if self.response_attrs:
            attrs.update(self.response_attrs)
        if self.finish_reasons is not None:
            attrs["gen_ai.response.finish_reasons"] = self.finish_reasons
        if self.output is not None:
            attrs["gen_ai.output.messages"] = attrs_of.stream_output(self.output)
        if self._ttfc is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = self._ttfc
        failure = error if error is not None else self.stream_error
        kind = attrs_of.error_type(failure, status)
        if kind is not None:
            attrs["error.type"] = kind
        parent = self.parent
        # A server span is an error only for 5xx (the HTTP conventions): a 4xx is the client's.
        description = _describe(tracing, failure, kind) if status >= 500 else None
        tracing.sink(
            Finished(
                f"{op} {model}" if model else op,
                "server",
                self.trace_id,
                self.span_id,
                parent.span_id if parent is not None else None,
                True,
                parent.tracestate if parent is not None else None,
                self.start_ns,
                _time_ns(),
                attrs,
                description,
            )
        )


class AttemptTrace:
    """One upstream attempt's client span: ``headers`` carry its context upstream (``backends.base.CallTrace``)."""

    __slots__ = (
        "_parts", "backend", "ended", "headers", "number", "parent_id", "request", "span_id", "start", "ttfc",
        "upstream_model", "why",
    )  # fmt: skip

    def __init__(
        self,
        request: RequestTrace,
        parent_id: int,
        backend: Backend,
        upstream_model: str,
        number: int,
        why: str,
    ) -> None:
        self.request = request
        self.parent_id = parent_id
        self.backend = backend
        self.upstream_model = upstream_model
        self.number = number
        self.why = why
        self.span_id = span_id = getrandbits(64) or 1
        self.start = _time_ns() if request.sampled else 0
        self.ended = False
        self.ttfc: float | None = None
        self._parts: list[AttemptTrace] | None = None
        parent = request.parent
        headers = {"traceparent": f"{request.prefix}{span_id:016x}{request.suffix}"}
        if parent is not None and parent.tracestate:
            headers["tracestate"] = parent.tracestate
        self.headers: Mapping[str, str] = headers

    def part(self, index: int) -> AttemptTrace:
        """A child client span for one part of a fan-out (its own upstream request), ended by :meth:`end`
        or with this attempt at the latest."""
        request = self.request
        child = AttemptTrace(request, self.span_id, self.backend, self.upstream_model, self.number, f"part {index}")
        if self._parts is None:
            self._parts = []
        self._parts.append(child)
        return child

    def end(self, error: BaseException | None = None) -> None:
        """The attempt is over (``error``: how it failed); idempotent."""
        if self.ended:
            return
        self.ended = True
        request = self.request
        if not request.sampled:
            return
        if self._parts:
            for part in self._parts:
                part.end(error)
        op = attrs_of.OPERATIONS.get(request.endpoint.value, request.endpoint.value)
        backend = self.backend
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": attrs_of.PROVIDERS.get(backend.kind, backend.kind),
            "gen_ai.request.model": self.upstream_model,
            "gateway.backend.name": backend.name,
            "gateway.backend.type": backend.kind,
            "gateway.attempt": self.why,
        }
        if self.number:
            attrs["http.request.resend_count"] = self.number
        server = request.tracing.server_of(backend)
        if server is not None:
            attrs["server.address"], attrs["server.port"] = server
        if self.ttfc is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = self.ttfc
        description = None
        if error is not None:
            attrs["error.type"] = kind = attrs_of.error_type(error, 0) or "error"
            reason = getattr(error, "reason", None)
            if isinstance(reason, str):
                attrs["gateway.upstream.reason"] = reason
            description = _describe(request.tracing, error, kind)
        request.tracing.sink(
            Finished(
                f"{op} {self.upstream_model}",
                "client",
                request.trace_id,
                self.span_id,
                self.parent_id,
                False,
                None,
                self.start,
                _time_ns(),
                attrs,
                description,
            )
        )


def _describe(tracing: Tracing, error: BaseException | None, kind: str | None) -> str:
    """A failed span's status description: the error's message only with ``capture_content`` (an
    upstream's message may quote the request), otherwise its ``error.type``."""
    message = getattr(error, "message", None) if tracing.capture_content else None
    return message if isinstance(message, str) and message else kind or "error"


TRACE_KEY: web.RequestKey[RequestTrace] = web.RequestKey("gateway_trace", RequestTrace)
