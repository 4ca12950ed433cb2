"""Test doubles: a scripted in-memory backend at the seam, and a fake upstream server.

:class:`ScriptedBackend` implements :class:`backends.base.Backend` in memory: no socket,
no adapter. Each call takes the next scripted :class:`Reply` (answer, raise a given
``backends.errors`` type, stall until released, stream N events then fail) and is
recorded, so flow tests assert what the service did, not how.

:class:`FakeUpstream` is a scriptable fake OpenAI/vLLM upstream: a real aiohttp server on
loopback. Tests queue behaviours (``FakeUpstream.script``); requests with nothing queued
get ``FakeUpstream.default(body)`` when set (random faults for soak runs), else a
normal, deterministic completion. It records every request it received (body and
headers), counts TCP connections (seen, and open now), requests in progress and
requests whose client (the gateway) hung up, so tests can assert on the upstream's
side that connections were reused or closed and work was cancelled. It can also
refuse connections for a while (``go_down``/``come_up``, same port) and fail its
health endpoints (``healthy = False``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import orjson
from aiohttp import web

from backends.base import Backend, CompletionResult, CompletionStream, TokenUsage, UpstreamCall
from backends.capabilities import Capabilities, Level
from backends.errors import UpstreamError

__all__ = ["Behaviour", "Call", "FakeUpstream", "Reply", "ScriptedBackend", "ScriptedStream"]


# --- the scripted in-memory backend ------------------------------------------------------------


class _Advances(Protocol):
    def advance(self, seconds: float) -> None: ...


@dataclass
class Reply:
    """What a :class:`ScriptedBackend` does with one call (``complete`` or ``stream``).

    In order: wait until :meth:`release` when ``stall`` is set; let ``takes`` seconds pass
    on the backend's clock (a fake clock: the attempt "took" that long); raise ``error``
    when ``events_before_error`` is None (before any byte: the call itself fails); else
    answer. A stream yields ``events`` events, or, when ``events_before_error`` is set,
    that many events and then raises ``error`` (0: the stream fails before its first event).
    """

    events: int = 2
    error: UpstreamError | None = None
    events_before_error: int | None = None
    stall: bool = False
    takes: float = 0.0
    released: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def release(self) -> None:
        self.released.set()

    @classmethod
    def answer(cls, events: int = 2) -> Reply:
        return cls(events=events)

    @classmethod
    def fail(cls, error: UpstreamError, *, takes: float = 0.0) -> Reply:
        return cls(error=error, takes=takes)

    @classmethod
    def stalled(cls, error: UpstreamError | None = None) -> Reply:
        """Hangs until :meth:`release`, then answers (or raises ``error``)."""
        return cls(error=error, stall=True)

    @classmethod
    def stream_then_fail(cls, events: int, error: UpstreamError) -> Reply:
        return cls(events=events, error=error, events_before_error=events)


@dataclass(frozen=True)
class Call:
    """One call a :class:`ScriptedBackend` received."""

    backend: str
    method: Literal["complete", "stream"]
    call: UpstreamCall

    @property
    def upstream_model(self) -> str:
        return self.call.upstream_model


class ScriptedBackend(Backend):
    """An in-memory backend whose answers are scripted per call.

    ``script`` holds the replies of the next calls, in order; a call with nothing queued
    gets ``default`` (a normal answer unless a test changes it). Every call is appended to
    ``calls`` (and to the shared ``journal``, when given, so a test sees the order across
    backends) when it starts, before any stall. ``active`` counts calls in progress and
    streams not yet closed. Answers name the backend in their text (``" from <name>"``).
    """

    kind: ClassVar[str] = "scripted"

    def __init__(
        self,
        name: str,
        capabilities: Capabilities | None = None,
        *,
        journal: list[Call] | None = None,
        clock: _Advances | None = None,
    ) -> None:
        super().__init__(name, capabilities if capabilities is not None else Capabilities.of(Level.NATIVE))
        self.script: deque[Reply] = deque()
        self.default = Reply()
        self.calls: list[Call] = []
        self.journal = journal
        self.clock = clock
        self.active = 0
        self.healthy = True
        self.closed = False

    def queue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    @property
    def upstream_models(self) -> list[str]:
        return [c.upstream_model for c in self.calls]

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        reply = await self._begin("complete", call)
        try:
            if reply.error is not None:
                raise reply.error
            return CompletionResult(self._body(call, reply.events), TokenUsage(3, reply.events))
        finally:
            self.active -= 1

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        reply = await self._begin("stream", call)
        if reply.error is not None and reply.events_before_error is None:
            self.active -= 1
            raise reply.error
        return ScriptedStream(self, call, reply)

    async def health(self) -> bool:
        return self.healthy

    async def close(self) -> None:
        self.closed = True

    async def _begin(self, method: Literal["complete", "stream"], call: UpstreamCall) -> Reply:
        reply = self.script.popleft() if self.script else self.default
        record = Call(self.name, method, call)
        self.calls.append(record)
        if self.journal is not None:
            self.journal.append(record)
        self.active += 1
        try:
            if reply.stall:
                await reply.released.wait()
        except BaseException:
            self.active -= 1
            raise
        if reply.takes and self.clock is not None:
            self.clock.advance(reply.takes)
        return reply

    def _body(self, call: UpstreamCall, events: int) -> bytes:
        return orjson.dumps(
            {
                "id": "cmpl-scripted",
                "object": "text_completion",
                "created": 1,
                "model": call.public_model,
                "choices": [{"index": 0, "text": f" from {self.name}", "logprobs": None, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": events, "total_tokens": 3 + events},
            }
        )


class ScriptedStream(CompletionStream):
    """The stream of one scripted call: ``reply.events`` events, or a failure after some."""

    def __init__(self, backend: ScriptedBackend, call: UpstreamCall, reply: Reply) -> None:
        self._backend = backend
        self._call = call
        self._reply = reply
        self.sent = 0
        self.closed = False

    async def __anext__(self) -> bytes:
        reply = self._reply
        if reply.events_before_error is not None and self.sent == reply.events_before_error:
            assert reply.error is not None
            raise reply.error
        if self.sent >= reply.events:
            raise StopAsyncIteration
        self.sent += 1
        if self.sent == reply.events and reply.events_before_error is None:
            self.finished = True
            self.usage = TokenUsage(3, reply.events)
        chunk = {
            "id": "cmpl-scripted",
            "object": "text_completion",
            "created": 1,
            "model": self._call.public_model,
            "choices": [{"index": 0, "text": f" {self._backend.name}{self.sent}", "logprobs": None,
                         "finish_reason": "length" if self.finished else None}],
        }  # fmt: skip
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self._backend.active -= 1


# --- the fake upstream server ------------------------------------------------------------------


@dataclass
class Behaviour:
    """What the fake does with one request.

    kind: ``ok`` (normal answer), ``status`` (answer ``status`` with ``body``),
    ``reset`` (drop the connection before answering), ``cut`` (stream ``events``
    chunks then drop the connection), ``stall`` (sleep ``delay`` before answering),
    ``stall_mid`` (stream ``events`` chunks then sleep ``delay``), ``garbage``
    (200 with a non-JSON body), ``error_event`` (stream ``events`` chunks then an
    error event and [DONE]), ``garbage_event`` (stream ``events`` chunks then an event
    that is not JSON, then [DONE]), ``raw`` (200 ``text/event-stream`` whose body is
    ``body``, bytes written as they are, in ``events``-byte writes when set), ``endless``
    (200 chunked body that never ends: ``body`` bytes written until the client hangs up).
    ``delay`` on ``ok`` paces stream chunks.
    ``hold`` waits until the test calls :meth:`release`, then answers normally: a request
    kept in flight for exactly as long as a test needs, with no timing window.
    """

    kind: str = "ok"
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: int = 0
    delay: float = 0.0
    released: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def release(self) -> None:
        self.released.set()


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class FakeUpstream:
    def __init__(
        self, *, model_field: str | None = None, spaced_json: bool = False, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.requests: list[Seen] = []
        self._ssl = ssl_context  # serve https (tests of TLS and mutual TLS)
        self.script: deque[Behaviour] = deque()
        self._peers: set[Any] = set()
        self.open_streams = 0
        self.cancelled_streams = 0
        self.active = 0  # completion requests being handled now
        self.cancelled = 0  # completion requests whose client hung up before the answer was complete
        self.health_checks = 0
        self.healthy = True  # False: /health and /v1/models answer 503
        # Chooses the behaviour of a request when ``script`` is empty (None: a normal answer).
        self.default: Callable[[dict[str, Any]], Behaviour] | None = None
        self._site: web.TCPSite | None = None
        self._model_field = model_field
        self._spaced = spaced_json
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # as large as any gateway request body
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)  # chat shapes when the body has messages
        app.router.add_post("/v1/responses", self._completions)  # OpenAI's Responses shapes (the path says)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def go_down(self) -> None:
        """Stop listening (new connections are refused) and drop every open connection."""
        assert self._runner is not None and self._site is not None
        await self._site.stop()
        self._site = None
        server = self._runner.server
        if server is not None:
            for handler in server.connections:
                handler.force_close()
        await asyncio.sleep(0)

    async def come_up(self) -> None:
        """Listen again on the same port."""
        assert self._runner is not None and self._site is None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True, ssl_context=self._ssl)
        await self._site.start()

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        server = self._runner.server if self._runner is not None else None
        return len(server.connections) if server is not None else 0

    @property
    def connections(self) -> int:
        """Distinct client connections seen (by peer address and port)."""
        return len(self._peers)

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- answers ----------------------------------------------------------------------
    def _dumps(self, obj: Any) -> bytes:
        if self._spaced:
            import json

            return json.dumps(obj).encode()
        return orjson.dumps(obj)

    def completion(self, body: dict[str, Any], *, text: str = " hello world") -> dict[str, Any]:
        n = int(body.get("n") or 1)
        if "messages" in body:  # a chat request: OpenAI's chat answer with the same text
            message = {"role": "assistant", "content": text}
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [
                    {"index": i, "message": message, "logprobs": None, "finish_reason": "length"} for i in range(n)
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n, "total_tokens": 3 + 2 * n},
            }
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": "length"} for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2 * n, "total_tokens": 3 + 2 * n},
        }

    def chunk(self, body: dict[str, Any], text: str, finish: str | None = None) -> bytes:
        if "messages" in body:  # a chat stream chunk with the same text
            delta = {"role": "assistant", "content": text}
            chat = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                "usage": None,
            }
            return b"data: " + self._dumps(chat) + b"\n\n"
        obj = {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": 1,
            "model": body.get("model"),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }
        return b"data: " + self._dumps(obj) + b"\n\n"

    async def _models(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        if not self.healthy:
            return web.json_response({"error": {"message": "down"}}, status=503)
        return web.json_response({"object": "list", "data": [{"id": "up-model", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.active += 1
        hung_up = True
        try:
            response = await self._answer(request)
            hung_up = False
            if response is None:  # ``reset``: no answer at all
                raise asyncio.CancelledError
            return response
        except asyncio.CancelledError:
            if hung_up:
                self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse | None:
        raw = await request.read()
        if request.transport is not None:
            self._peers.add(request.transport.get_extra_info("peername"))
        body = orjson.loads(raw)
        self.requests.append(Seen(request.path, dict(request.headers), body))
        if self.script:
            behaviour = self.script.popleft()
        elif self.default is not None:
            behaviour = self.default(body)
        else:
            behaviour = Behaviour()
        if behaviour.kind == "reset":
            assert request.transport is not None
            request.transport.abort()
            return None
        if behaviour.kind == "stall":
            await asyncio.sleep(behaviour.delay)
        if behaviour.kind == "hold":
            await behaviour.released.wait()
        if behaviour.kind == "status":
            payload = behaviour.body if isinstance(behaviour.body, bytes) else orjson.dumps(behaviour.body)
            return web.Response(
                body=payload, status=behaviour.status, headers=behaviour.headers, content_type="application/json"
            )
        if behaviour.kind == "garbage":
            return web.Response(body=b"<html>oops</html>", content_type="text/html")
        if behaviour.kind in ("raw", "endless"):
            return await self._raw(request, behaviour)
        if request.path.endswith("/responses"):
            missing = self.unpersisted_item(body)
            if missing is not None:  # OpenAI's answer, word for word
                message = (
                    f"Item with id '{missing}' not found. Items are not persisted when `store` is set to false. "
                    "Try again with `store` set to true, or remove this item from your input."
                )
                error = {"message": message, "type": "invalid_request_error", "param": "input", "code": None}
                return web.json_response({"error": error}, status=404)
            if not body.get("stream"):
                return web.Response(body=self._dumps(self.response(body)), content_type="application/json")
            return await self._stream_responses(request, body, behaviour)
        if not body.get("stream"):
            return web.Response(body=self._dumps(self.completion(body)), content_type="application/json")
        return await self._stream(request, body, behaviour)

    async def _raw(self, request: web.Request, behaviour: Behaviour) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **behaviour.headers})
        await resp.prepare(request)
        data: bytes = behaviour.body
        if behaviour.kind == "endless":
            try:
                while True:  # until the gateway hangs up (CancelledError or a reset)
                    await resp.write(data)
                    await asyncio.sleep(0)  # a reader that keeps up never makes write() wait: let others run
            except ConnectionResetError:
                return resp
        step = behaviour.events or len(data) or 1
        try:
            for at in range(0, len(data), step):
                await resp.write(data[at : at + step])
            await resp.write_eof()
        except ConnectionResetError:  # the gateway hung up (a body over its caps): as a real upstream sees it
            pass
        return resp

    async def _stream(self, request: web.Request, body: dict[str, Any], behaviour: Behaviour) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open_streams += 1
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)  # chat sends the latter
        try:
            for i in range(tokens):
                if behaviour.kind in ("cut", "stall_mid", "error_event", "garbage_event") and i == behaviour.events:
                    if behaviour.kind == "cut":
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    if behaviour.kind == "stall_mid":
                        await asyncio.sleep(behaviour.delay)
                    if behaviour.kind == "error_event":
                        err = {
                            "error": {
                                "message": "engine died",
                                "type": "InternalServerError",
                                "param": None,
                                "code": 500,
                            }
                        }
                        await resp.write(b"data: " + orjson.dumps(err) + b"\n\ndata: [DONE]\n\n")
                        return resp
                    if behaviour.kind == "garbage_event":
                        await resp.write(b"data: {not json at all\n\ndata: [DONE]\n\n")
                        return resp
                finish = "length" if i == tokens - 1 else None
                await resp.write(self.chunk(body, f" t{i}", finish))
                if behaviour.delay and behaviour.kind == "ok":
                    await asyncio.sleep(behaviour.delay)
            options = body.get("stream_options") or {}
            if options.get("include_usage"):
                usage = {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "created": 1,
                    "model": body.get("model"),
                    "choices": [],
                    "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
                }
                await resp.write(b"data: " + self._dumps(usage) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        finally:
            self.open_streams -= 1
        return resp

    # --- OpenAI's Responses API (POST /v1/responses) ---------------------------------------------
    @staticmethod
    def unpersisted_item(body: dict[str, Any]) -> str | None:
        """The id of a reasoning item OpenAI would have to look up although nothing was kept: one
        without ``encrypted_content``, sent with ``store: false`` (the upstream keeps nothing then, so
        this fake, which keeps nothing either, answers OpenAI's 404 for it)."""
        items = body.get("input")
        if body.get("store") is not False or not isinstance(items, list):
            return None
        for item in items:
            if isinstance(item, dict) and item.get("type") == "reasoning" and not item.get("encrypted_content"):
                return str(item.get("id"))
        return None

    def response(self, body: dict[str, Any], *, status: str = "completed") -> dict[str, Any]:
        """OpenAI's Response object for ``body``: one message item of ``max_output_tokens`` words
        (16 by default), as the stream sends them."""
        tokens = int(body.get("max_output_tokens") or 16)
        text = "".join(f" t{i}" for i in range(tokens))
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        usage = {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 3 + tokens,
        }
        return {
            "id": "resp_fake",
            "object": "response",
            "created_at": 1,
            "status": status,
            "model": body.get("model"),
            "output": [message] if status != "in_progress" else [],
            "tools": body.get("tools") or [],
            "usage": usage if status != "in_progress" else None,
        }

    def response_event(self, seq: int, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": seq, **fields}
        return b"event: " + kind.encode() + b"\ndata: " + self._dumps(event) + b"\n\n"

    async def _stream_responses(
        self, request: web.Request, body: dict[str, Any], behaviour: Behaviour
    ) -> web.StreamResponse:
        """OpenAI's Responses events: created, in_progress, one message item of ``max_output_tokens``
        deltas (16 by default), completed. ``cut``/``error_event`` after ``events`` deltas."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.open_streams += 1
        tokens = int(body.get("max_output_tokens") or 16)
        event = self.response_event
        start = self.response(body, status="in_progress")
        at = {"item_id": "msg_fake", "output_index": 0}
        try:
            head = event(0, "response.created", response=start) + event(1, "response.in_progress", response=start)
            item = {"id": "msg_fake", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
            head += event(2, "response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            await resp.write(head + event(3, "response.content_part.added", **at, content_index=0, part=part))
            seq = 4
            for i in range(tokens):
                if behaviour.kind == "cut" and i == behaviour.events:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if behaviour.kind == "error_event" and i == behaviour.events:
                    await resp.write(event(seq, "error", code="server_error", message="engine died", param=None))
                    await resp.write_eof()
                    return resp
                delta = event(seq, "response.output_text.delta", **at, content_index=0, delta=f" t{i}", logprobs=[])
                await resp.write(delta)
                seq += 1
                if behaviour.delay and behaviour.kind == "ok":
                    await asyncio.sleep(behaviour.delay)
            text = "".join(f" t{i}" for i in range(tokens))
            final = self.response(body)
            tail = event(seq, "response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            tail += event(seq + 1, "response.content_part.done", **at, content_index=0, part={**part, "text": text})
            tail += event(seq + 2, "response.output_item.done", output_index=0, item=final["output"][0])
            tail += event(seq + 3, "response.completed", response=final)
            await resp.write(tail)
            await resp.write_eof()
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise
        finally:
            self.open_streams -= 1
        return resp


class Reads(CompletionStream):
    """A stream of the given reads, then a clean end."""

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    async def __anext__(self) -> bytes:
        if self._reads:
            return self._reads.pop(0)
        self.finished = True
        raise StopAsyncIteration

    async def aclose(self) -> None:
        pass
