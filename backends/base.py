"""The backend protocol every adapter implements.

A backend turns one validated request, wrapped in a :class:`Call` with what the route
decided, into either a finished OpenAI body or a stream of ready-to-send SSE events
(:class:`~backends.results.CompletionResult`, :class:`~backends.results.CompletionStream`,
their contract in :mod:`backends.results`; importable from here too):

- completions (``POST /v1/completions``): :meth:`Backend.complete` / :meth:`Backend.stream`
  with an :data:`UpstreamCall` (a :class:`~schemas.completions.CompletionRequest`);
- chat (``POST /v1/chat/completions``): :meth:`Backend.chat` / :meth:`Backend.chat_stream`
  with a :data:`ChatCall` (a :class:`~schemas.chat.ChatCompletionRequest`), only on backends
  whose :attr:`Backend.endpoints` include ``chat``; the router sends no other;
- embeddings (``POST /v1/embeddings``) and rerank (``POST /v1/rerank``): :meth:`Backend.embed`
  with an :data:`EmbeddingCall`, :meth:`Backend.rerank` with a :data:`RerankCall`, non-streamed,
  on backends whose :attr:`Backend.endpoints` include them (their tables:
  :attr:`Backend.embedding_capabilities`, :attr:`Backend.rerank_capabilities`);
- responses (``POST /v1/responses``): a family with a native endpoint (:attr:`Backend.responses_native`:
  ``openai``, ``vllm``) implements :meth:`Backend.responses` / :meth:`Backend.responses_stream`
  with a :data:`ResponsesCall` (a :class:`~schemas.responses.ResponsesRequest`); every other
  family serving chat is served through its chat translator (``backends.responses.bridge``,
  picked by the request path). A Responses stream yields Responses events (``event:``/``data:``,
  ``sequence_number`` from 0), never ``[DONE]``;
  :attr:`Backend.embedding_capabilities`, :attr:`Backend.rerank_capabilities`);
- vLLM's tokenizer API (``POST /tokenize``, ``POST /detokenize``): :meth:`Backend.tokenize` with a
  :data:`TokenizeCall`, :meth:`Backend.detokenize` with a :data:`DetokenizeCall`, where
  :attr:`Backend.endpoints` include them (the vLLM family).

What an upstream reports about its models (vLLM: ``max_model_len``, ``root``), learnt at start-up,
is :meth:`Backend.model_info`, for ``GET /v1/models``.

Each backend family has one translator per endpoint behind these methods. Adapters never
see raw client JSON and raise only ``schemas.errors``/``backends.errors`` types.

Lifecycle: ``await start()`` once before serving (opens pools, may probe),
``await close()`` once at shutdown. Methods are called concurrently from one
event loop; adapters are not thread-safe.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from backends.capabilities import Capabilities
from backends.results import CompletionResult, CompletionStream, TokenUsage, usage_of
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.embeddings import EmbeddingRequest
from schemas.endpoints import POOLING_ENDPOINTS, TOKENIZER_ENDPOINTS, Endpoint
from schemas.rerank import RerankRequest
from schemas.responses import ResponsesRequest
from schemas.tokenize import DetokenizeRequest, TokenizeRequest

if TYPE_CHECKING:
    from backends.chat_capabilities import ChatCapabilities
    from backends.pooling_capabilities import PoolingCapabilities
    from schemas.errors import UnsupportedParameterError

__all__ = [
    "ROUTING_SESSION",
    "Backend",
    "Call",
    "CallTrace",
    "ChatCall",
    "CompletionResult",
    "CompletionStream",
    "DetokenizeCall",
    "EmbeddingCall",
    "Reconfigurable",
    "ReconfigureReport",
    "RerankCall",
    "ResponsesCall",
    "ResponsesTable",
    "TokenUsage",
    "TokenizeCall",
    "UpstreamCall",
    "usage_of",
]

Req = TypeVar(
    "Req",
    CompletionRequest,
    ChatCompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    ResponsesRequest,
    TokenizeRequest,
    DetokenizeRequest,
)


# The client's conversation for routing (the ``x-session-id`` header; None without it): set by the
# front door for each request, read by backends that keep a session on one server
# (``backends.vllm.routing.score``). A context variable, so no signature on the request path grows.
ROUTING_SESSION: ContextVar[str | None] = ContextVar("routing_session", default=None)


class CallTrace(Protocol):
    """The gateway's trace of one attempt, as an adapter sees it (no OpenTelemetry below the gateway).

    ``headers`` (W3C ``traceparent``, and ``tracestate`` when the client sent one) go on the
    attempt's upstream request, so the upstream's own spans join the trace under this attempt.
    An adapter that sends one request per part (a fan-out) asks :meth:`part` for each part's
    own headers; a part ends with the attempt at the latest.
    """

    @property
    def headers(self) -> Mapping[str, str]: ...

    def part(self, index: int) -> CallTrace: ...

    def end(self, error: BaseException | None = None) -> None: ...


@dataclass(slots=True, frozen=True)
class Call(Generic[Req]):
    """One attempt at one route: the request plus what the route decided."""

    request: Req
    upstream_model: str  # the upstream's model id (route ``model``)
    public_model: str  # the name the client asked for; every answer carries it
    request_id: str
    trace: CallTrace | None = None  # None: tracing is off
    # False: what comes back is read by the gateway itself (the Responses bridge, BridgeChatCall), not
    # sent to a client, so a relay skips what only a client needs.
    for_client: ClassVar[bool] = True

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        """The attempt's upstream request headers: a copy of ``base`` (the backend's own) plus its
        request id and, when traced, its span context (the attempt's, not the client's: it is our child)."""
        headers = base.copy()
        headers["X-Request-Id"] = self.request_id
        if self.trace is not None:
            headers.update(self.trace.headers)
        return headers


# Real subclasses, not aliases of ``Call[...]``: constructing through a generic alias makes
# typing set ``__orig_class__`` on every instance, which a frozen slotted dataclass refuses
# (TypeError on Python 3.11) and which would cost an exception per request anyway.
class UpstreamCall(Call[CompletionRequest]):
    """A completions attempt."""

    __slots__ = ()


class ChatCall(Call[ChatCompletionRequest]):
    """A chat attempt."""

    __slots__ = ()


class BridgeChatCall(ChatCall):
    """The chat attempt a Responses attempt becomes on a family without its own Responses endpoint
    (``backends.responses.bridge``): its stream is read by the bridge, never relayed to a client.

    A family's chat relay gives it the upstream's events as they came, vouched as for a client
    (whole events, every choice finished, an error event raised) but not rewritten for one: no
    model name swapped in, no ``"usage": null`` added, vLLM's null keys and reasoning name left as
    sent; the usage chunk is not yielded: its object, details included, is the stream's
    ``usage_fields`` (the bridge reads it at the end).
    """

    __slots__ = ()
    for_client: ClassVar[bool] = False


class EmbeddingCall(Call[EmbeddingRequest]):
    """An embeddings attempt."""

    __slots__ = ()


class RerankCall(Call[RerankRequest]):
    """A rerank attempt."""

    __slots__ = ()


class ResponsesCall(Call[ResponsesRequest]):
    """A Responses attempt."""

    __slots__ = ()


class TokenizeCall(Call[TokenizeRequest]):
    """A ``/tokenize`` attempt."""

    __slots__ = ()


class DetokenizeCall(Call[DetokenizeRequest]):
    """A ``/detokenize`` attempt."""

    __slots__ = ()


class ResponsesTable(Protocol):
    """A family's Responses capability table (``backends.responses.capabilities.ResponsesCapabilities``;
    a Protocol here so this module does not import the Responses package, which builds on it)."""

    def refusal(self, request: ResponsesRequest, backend: str, kind: str) -> UnsupportedParameterError | None: ...

    def level(self, name: str, form: str | None = None) -> str: ...


class Backend(ABC):
    """One configured backend entry."""

    kind: ClassVar[str]
    # The endpoints this backend serves; a family that has a chat translator adds ``CHAT``
    # and sets :attr:`chat_capabilities`; one that embeds or reranks adds those and sets their tables.
    endpoints: frozenset[Endpoint] = frozenset({Endpoint.COMPLETIONS})
    chat_capabilities: ChatCapabilities | None = None
    embedding_capabilities: PoolingCapabilities | None = None
    rerank_capabilities: PoolingCapabilities | None = None
    # The family's Responses table (its folder's); None: derived from the chat table, for a
    # family that serves Responses through its chat translator.
    responses_capabilities: ResponsesTable | None = None
    # Whether :meth:`responses` is the family's own (else the chat bridge serves Responses).
    responses_native: ClassVar[bool] = False

    def __init__(self, name: str, capabilities: Capabilities) -> None:
        self.name = name
        self.capabilities = capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open pools and probe the upstream; called once before serving."""

    def context_length(self, upstream_model: str) -> int | None:
        """``upstream_model``'s context window in tokens (prompt and output together) when this
        backend knows it (vLLM: ``max_model_len``), else None; Responses' ``truncation`` reads it."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything; called once at shutdown."""

    @property
    def default_endpoints(self) -> frozenset[Endpoint]:
        """What a model on this backend is served on when its config lists no ``endpoints``: the
        generation endpoints, or the pooling ones where it serves nothing else (tei, a pooling pool)."""
        own = self.endpoints - TOKENIZER_ENDPOINTS  # served wherever a backend has them (the router)
        generation = own - POOLING_ENDPOINTS
        return generation or own

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        """A non-streaming completion (only where :attr:`endpoints` has ``completions``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no completions endpoint")

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        """Start a streaming completion; returns once the upstream accepted it."""
        raise NotImplementedError(f"{type(self).__name__} serves no completions endpoint")

    async def chat(self, call: ChatCall) -> CompletionResult:
        """A non-streaming chat completion (only where :attr:`endpoints` has ``chat``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no chat endpoint")

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        """Start a streaming chat completion; returns once the upstream accepted it."""
        raise NotImplementedError(f"{type(self).__name__} serves no chat endpoint")

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        """Embeddings, OpenAI's list object (only where :attr:`endpoints` has ``embeddings``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no embeddings endpoint")

    async def rerank(self, call: RerankCall) -> CompletionResult:
        """Relevance scores, sorted (only where :attr:`endpoints` has ``rerank``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no rerank endpoint")

    async def responses(self, call: ResponsesCall) -> CompletionResult:
        """A non-streaming Response (only where :attr:`responses_native`)."""
        raise NotImplementedError(f"{type(self).__name__} has no native responses endpoint")

    async def responses_stream(self, call: ResponsesCall) -> CompletionStream:
        """Start a streamed Response, Responses events (only where :attr:`responses_native`)."""
        raise NotImplementedError(f"{type(self).__name__} has no native responses endpoint")

    async def tokenize(self, call: TokenizeCall) -> CompletionResult:
        """vLLM's ``/tokenize`` answer (only where :attr:`endpoints` has ``tokenize``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no tokenize endpoint")

    async def detokenize(self, call: DetokenizeCall) -> CompletionResult:
        """vLLM's ``/detokenize`` answer (only where :attr:`endpoints` has ``detokenize``)."""
        raise NotImplementedError(f"{type(self).__name__} serves no detokenize endpoint")

    def model_info(self, upstream_model: str) -> dict[str, Any] | None:
        """What the upstream reported about ``upstream_model`` (vLLM: ``max_model_len``, ``root``) when
        it started or reconnected; None when nothing is known. Never calls the upstream."""
        return None

    async def health(self) -> bool:
        """Whether the upstream answers; used by probes (default: assume healthy)."""
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class ReconfigureReport(Protocol):
    """What :meth:`Reconfigurable.reconfigure` did."""

    @property
    def ok(self) -> bool:
        """False when the backend still runs (some of) its previous config."""

    def describe(self) -> str:
        """One log line: what was applied, and how (in place, new processes), or why not."""


@runtime_checkable
class Reconfigurable(Protocol):
    """A backend that takes a changed config section while serving instead of being replaced
    (a ``vllm-pool``: its processes outlive a reload). ``gateway.reload`` and the ``--workers``
    control process call it; configs are the backend's ``schemas.config`` section.
    """

    name: str

    def runs(self, config: Any) -> bool:
        """Whether ``config`` is exactly what it runs now (nothing to do)."""

    def restart_keys(self, config: Any) -> list[tuple[str, str]] | None:
        """``(key, why)`` for each changed key only a restart applies; None when ``config`` is
        not a section it can take at all (another type: build a new backend instead)."""

    async def reconfigure(self, config: Any) -> ReconfigureReport:
        """Apply ``config``; returns when done (or stopped: see the report)."""
