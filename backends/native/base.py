"""The base of the native-API backends (``tgi``, ``ollama``, ``llamacpp``): HTTP, framing, fan-out.

A subclass is one translator: it says where to POST (``complete_path``, ``stream_path``),
how the stream is framed (SSE or NDJSON), and implements three mappings:

- :meth:`NativeBackend.payload`: one part (one prompt, one choice) -> the native body,
  with every default made explicit so the request means what it means on OpenAI;
- :meth:`NativeBackend.generation`: the native non-streaming answer -> :class:`Generation`;
- :meth:`NativeBackend.event`: one native stream event -> :class:`Event` (or None to skip).

Everything else is shared: ``n``, ``best_of`` and prompt batches by fan-out
(``backends.emulation.fanout``), the OpenAI choice and logprobs (``backends.native.choice``),
error statuses (``backends.errors``), and the stream contract of ``backends.base``: a
stream that ends without its final event, or with a native error event, raises an
``UpstreamProtocolError`` after the chunks that came before it.

Who closes what: every response is released exactly once (non-streaming right after the
read; streams by :meth:`NativeChoiceStream.aclose`, which first drains what the upstream
still sends after its final event, bounded, so the connection can be reused).

Embeddings (``POST /v1/embeddings``): a family that sets ``embedding_capabilities`` serves them
through :meth:`NativeBackend.embed` (``backends.native.pooling``: the batch cut at the server's
inputs per call, parts joined in order); it says where (``embed_path``) and how a part is sent and read.

Chat (``POST /v1/chat/completions``): a family that sets :attr:`NativeBackend.chat_translator`
(a :class:`~backends.native.chat.ChatTranslator`) serves chat too, through the same HTTP,
framing, fan-out (``n``) and stream contract; only the decoder of one part's events differs
(``backends.native.stream``: ``TextEvents`` for completions, ``ChatEvents`` for chat).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import orjson

from backends.base import (
    Backend,
    Call,
    ChatCall,
    CompletionResult,
    CompletionStream,
    EmbeddingCall,
    TokenUsage,
    UpstreamCall,
)
from backends.capabilities import Capabilities
from backends.emulation import fanout
from backends.emulation.fanout import ChoiceStream, FanoutStream, Part, PartResult
from backends.errors import (
    UpstreamProtocolError,
    UpstreamStatusError,
    error_from_upstream_body,
)
from backends.exact_json import loads_keeping_integers
from backends.native.chat import ChatTranslator, ChatTurn, chat_head, estimate_usage, piece_chars
from backends.native.choice import ChoiceTracker, build_choice
from backends.native.common import Event, Generation, completion_head
from backends.native.pooling import PartVectors, embed_in_parts
from backends.native.stream import ChatEvents, Events, Finished, NativeChoiceStream, TextEvents
from backends.transport import make_transport
from backends.transport.base import HTTPTransport, UpstreamResponse, get_ok, send_ok
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import LlamaCppBackendConfig, OllamaBackendConfig, TGIBackendConfig
from schemas.embeddings import EmbeddingRequest
from schemas.endpoints import Endpoint
from schemas.errors import UnsupportedParameterError

__all__ = ["NativeBackend", "NativeConfig"]

NativeConfig = TGIBackendConfig | OllamaBackendConfig | LlamaCppBackendConfig
Header = Callable[[str], str | None]


class NativeBackend(Backend):
    complete_path: ClassVar[str]
    stream_path: ClassVar[str]
    health_path: ClassVar[str]
    framing: ClassVar[Literal["sse", "ndjson"]]
    strips_stop: ClassVar[bool]  # the upstream removes stop sequences from its output itself
    default_capabilities: ClassVar[Capabilities]
    chat_translator: ClassVar[type[ChatTranslator] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        translator = cls.__dict__.get("chat_translator")
        if translator is not None:  # a family with a chat translator serves chat, and Responses through it
            cls.endpoints = cls.endpoints | {Endpoint.COMPLETIONS, Endpoint.CHAT, Endpoint.RESPONSES}
            cls.chat_capabilities = translator.table
        if cls.__dict__.get("embedding_capabilities") is not None:  # and one with an embeddings table, those
            cls.endpoints = cls.endpoints | {Endpoint.EMBEDDINGS}

    def __init__(self, config: NativeConfig, transport: HTTPTransport | None = None) -> None:
        super().__init__(config.name, self.default_capabilities.with_overrides(config.capabilities))
        self._chat = self.chat_translator(self.name, self.kind) if self.chat_translator is not None else None
        self.config = config
        self.base_url = str(config.base_url).rstrip("/")
        self._transport = transport if transport is not None else make_transport(config)
        headers = {name: value.get_secret_value() for name, value in config.headers.items()}
        headers["Content-Type"] = "application/json"
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._headers = headers

    # --- the translator --------------------------------------------------------------------
    @abstractmethod
    def payload(self, request: CompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        """The native body for one part (one prompt, one choice)."""

    @abstractmethod
    def generation(self, obj: Any, header: Header) -> Generation:
        """The native non-streaming answer, parsed; raise ``UpstreamProtocolError`` on a bad shape."""

    @abstractmethod
    def event(self, obj: dict[str, Any]) -> Event | None:
        """One native stream event (None: nothing for the client); raise on a native error event."""

    def status_error(self, status: int, data: bytes, retry_after: str | None) -> UpstreamStatusError:
        """A non-200 answer as our error (override where a native status means something else)."""
        return error_from_upstream_body(status, data, retry_after, self.name)

    async def echo_text(self, request: CompletionRequest, call: UpstreamCall) -> str:
        """The prompt as text, for ``echo``; text-only backends refuse token ids before this."""
        prompt = request.prompt
        if not isinstance(prompt, str):
            raise UnsupportedParameterError(
                f"'prompt' is not supported by backend '{self.name}': token ids cannot be echoed",
                param="prompt",
                backend=self.name,
            )
        return prompt

    # --- HTTP ---------------------------------------------------------------------------------
    async def post(self, path: str, payload: dict[str, Any], call: Call[Any], *, stream: bool) -> UpstreamResponse:
        """POST ``payload``; returns the 200 response (the caller releases it), raises otherwise."""
        headers = call.headers(self._headers)  # with the attempt's (or the fan-out part's) span context
        return await send_ok(
            self._transport,
            self.base_url + path,
            orjson.dumps(payload),
            headers,
            stream=stream,
            status_error=self.status_error,
        )

    async def post_json(self, path: str, payload: dict[str, Any], call: Call[Any]) -> tuple[Any, Header]:
        resp = await self.post(path, payload, call, stream=False)
        try:
            data = await resp.read()
        finally:
            resp.release()
        try:
            return loads_keeping_integers(data, self.name), resp.header  # a tool call's big ids stay exact
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=self.name) from None

    # --- the protocol ---------------------------------------------------------------------------
    def _check(self, request: CompletionRequest) -> None:
        """The router's capability check again, for callers that did not route (and as a guard)."""
        error = self.capabilities.refusal(request, self.name, self.kind)
        if error is not None:
            raise error

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        self._check(call.request)
        plan = fanout.plan(call.request)
        choices, usage = await fanout.complete(
            plan, lambda part: self._complete_part(part, fanout.part_call(call, plan, part))
        )
        return _answer(completion_head(call.public_model), choices, usage)

    async def _complete_part(self, part: Part[CompletionRequest], call: UpstreamCall) -> PartResult:
        request = part.request
        echo = await self.echo_text(request, call) if request.echo else ""
        obj, header = await self.post_json(
            self.complete_path, self.payload(request, call.upstream_model, stream=False), call
        )
        gen = self.generation(obj, header)
        choice = build_choice(request, gen, echo, strips_stop=self.strips_stop, backend=self.name)
        usage = gen.usage if request.max_tokens != 0 else TokenUsage(gen.usage.prompt_tokens, 0)
        return PartResult(choice, usage)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        self._check(call.request)
        plan = fanout.plan(call.request)
        streams = await fanout.open_streams(
            plan, lambda part: self._open_part(part, fanout.part_call(call, plan, part))
        )
        return FanoutStream(plan, streams, completion_head(call.public_model), include_usage=call.request.include_usage)

    async def _open_part(self, part: Part[CompletionRequest], call: UpstreamCall) -> ChoiceStream:
        request = part.request
        if request.max_tokens == 0:  # nothing to stream: one finished choice
            return Finished(await self._complete_part(part, call))
        echo = await self.echo_text(request, call) if request.echo else ""
        resp = await self.post(
            self.stream_path, self.payload(request, call.upstream_model, stream=True), call, stream=True
        )
        tracker = ChoiceTracker(request, echo, strips_stop=self.strips_stop, backend=self.name)
        return self._choice_stream(resp, TextEvents(self.event, tracker), self.framing)

    def _choice_stream(
        self, resp: UpstreamResponse, events: Events, framing: Literal["sse", "ndjson"]
    ) -> NativeChoiceStream:
        return NativeChoiceStream(
            self.name, resp, events, framing=framing, max_event_bytes=self.config.limits.max_event_bytes
        )

    # --- chat ---------------------------------------------------------------------------------------
    def _translator(self, request: ChatCompletionRequest) -> ChatTranslator:
        translator = self._chat
        if translator is None:
            raise NotImplementedError(f"{type(self).__name__} serves no chat endpoint")
        translator.check(request)
        return translator

    def _turn(self, part: Part[ChatCompletionRequest], call: ChatCall) -> ChatTurn:
        return ChatTurn(part.request, backend=self.name, call_ids=f"{call.request_id}:{part.candidate}")

    async def chat(self, call: ChatCall) -> CompletionResult:
        translator = self._translator(call.request)
        plan = fanout.plan_n(call.request)

        async def one(part: Part[ChatCompletionRequest]) -> PartResult:
            payload = translator.payload(part.request, call.upstream_model, stream=False)
            obj, _ = await self.post_json(translator.path, payload, fanout.part_call(call, plan, part))
            piece = translator.answer(obj, part.request)
            usage = piece.usage or estimate_usage(part.request, piece_chars(piece))
            return PartResult(self._turn(part, call).message(piece), usage)

        choices, usage = await fanout.complete(plan, one)
        return _answer({**chat_head(call.public_model), "object": "chat.completion"}, choices, usage, keep=True)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        translator = self._translator(call.request)
        plan = fanout.plan_n(call.request)

        async def open_one(part: Part[ChatCompletionRequest]) -> ChoiceStream:
            payload = translator.payload(part.request, call.upstream_model, stream=True)
            resp = await self.post(translator.path, payload, fanout.part_call(call, plan, part), stream=True)
            limit = self.config.limits.max_response_bytes
            events = ChatEvents(translator, self._turn(part, call), part.request, max_calls_bytes=limit)
            return self._choice_stream(resp, events, translator.framing)

        streams = await fanout.open_streams(plan, open_one)
        return FanoutStream(plan, streams, chat_head(call.public_model), include_usage=call.request.include_usage)

    # --- embeddings (a family with an embeddings table: ``embed_path``, its payload and answer) -----
    embed_path: ClassVar[str] = ""

    def embed_payload(self, request: EmbeddingRequest, model: str, inputs: Sequence[Any]) -> dict[str, Any]:
        """The native body for one part of a batch."""
        raise NotImplementedError(f"{type(self).__name__} serves no embeddings endpoint")

    def embed_answer(self, obj: Any, inputs: int) -> PartVectors:
        """One part's native answer: its vectors in order and its usage."""
        raise NotImplementedError(f"{type(self).__name__} serves no embeddings endpoint")

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        table = self.embedding_capabilities
        error = None if table is None else table.refusal(call.request, self.name, self.kind)
        if error is not None:
            raise error

        async def send(part: Sequence[Any]) -> PartVectors:
            payload = self.embed_payload(call.request, call.upstream_model, part)
            obj, _ = await self.post_json(self.embed_path, payload, call)
            return self.embed_answer(obj, len(part))

        return await embed_in_parts(call, self.config.embeddings, send, self.name)  # type: ignore[union-attr]

    async def health(self) -> bool:
        headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        return await get_ok(self._transport, self.base_url + self.health_path, headers) is not None

    async def close(self) -> None:
        await self._transport.close()


def _answer(
    head: dict[str, Any], choices: list[dict[str, Any]], usage: TokenUsage, *, keep: bool = False
) -> CompletionResult:
    """A whole non-streaming answer (either endpoint): the head, the fanned-in choices, usage.

    ``keep``: the object goes with the bytes (``CompletionResult.answer``), so a Responses request
    served through chat (``backends.responses.bridge``) builds its Response without parsing it again.
    """
    body = {**head, "choices": choices, "system_fingerprint": None, "usage": usage.as_json()}
    return CompletionResult(orjson.dumps(body), usage, answer=body if keep else None)
