"""A real OTLP trace receiver for tests: HTTP/protobuf (``POST /v1/traces``) and gRPC (``TraceService/Export``).

Each export is decoded with ``opentelemetry-proto`` (the collector's own message types) into
:class:`Span` records; ``raw`` keeps every request body as received, so a test can scan the
bytes on the wire for what must never be there (an API key, a prompt). ``delay`` makes the
receiver slow and ``status`` makes it refuse, to test that neither reaches a request.
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["GrpcReceiver", "HttpReceiver", "Span"]

_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


@dataclass
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    status_message: str
    start: int
    end: int
    resource: dict[str, Any] = field(default_factory=dict)


def decode(body: bytes) -> list[Span]:
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    Span(
                        s.name,
                        _KINDS.get(s.kind, str(s.kind)),
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in s.attributes},
                        s.status.code,
                        s.status.message,
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                        resource,
                    )
                )
    return spans


class _Store:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.raw: list[bytes] = []
        self.exports = 0
        self.delay = 0.0  # seconds each export is held (cut short when the receiver stops)
        self.status = 200  # HTTP status (or, 503: gRPC UNAVAILABLE) to answer with
        self.stopping = threading.Event()

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def by_kind(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]


class HttpReceiver(_Store):
    """OTLP/HTTP on a loopback port, served by the test's event loop."""

    def __init__(self) -> None:
        super().__init__()
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _export(self, request: web.Request) -> web.Response:
        import asyncio

        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.raw.append(body + str(dict(request.headers)).encode())
        self.exports += 1
        if self.delay:
            await asyncio.get_running_loop().run_in_executor(None, self.stopping.wait, self.delay)
        if self.status != 200:
            return web.Response(status=self.status)
        self.spans.extend(decode(body))
        return web.Response(
            body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def stop(self) -> None:
        self.stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class GrpcReceiver(_Store):
    """OTLP/gRPC (``opentelemetry.proto.collector.trace.v1.TraceService``) on a loopback port, in threads."""

    def __init__(self) -> None:
        super().__init__()
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()
        self.port = 0

    def start(self) -> str:
        store = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(
                self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
            ) -> trace_service_pb2.ExportTraceServiceResponse:
                body = request.SerializeToString()
                metadata = str(list(context.invocation_metadata())).encode()
                with store._lock:
                    store.raw.append(body + metadata)
                    store.exports += 1
                if store.delay:
                    store.stopping.wait(store.delay)
                if store.status != 200:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "refusing")
                with store._lock:
                    store.spans.extend(decode(body))
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
