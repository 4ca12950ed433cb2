"""Running one call on a set of endpoints: pick, send, and retry on another endpoint.

Contract:
- only ``available`` endpoints are picked (``Balancer.pick``); the chosen endpoint's
  ``in_flight`` counts the call until it finished, failed, or (streams) was closed;
- a failure that :func:`backends.errors.retryable` calls worth another try (the same rule
  as the service's retry policy: no connection, timeout, 429/5xx, a stream cut or stall
  before its first event) moves to an endpoint not tried yet (a restarted worker counts
  as new), at most ``routing.max_attempts`` tries in all; the owner is told about each
  failure (``on_failure``) so it can take a dead worker out at once. This is the one retry
  inside a backend, kept because a pool is one route to the service: without it a worker
  crash would reach clients while its siblings are healthy (the service's retries are off
  by default and its failover moves between routes, not workers). The transport below
  never resends a request that reached an upstream;
- while no endpoint is available, a call waits up to ``routing.wait_for_ready`` seconds
  (woken by :meth:`Dispatcher.notify`), then fails with :class:`NoReadyWorkerError`
  (503, ``Retry-After``); it fails at once when nothing can become available
  (``hopeless``) or the dispatcher is closed;
- streams: the first event is read here, so everything before it can still move to
  another endpoint; after it nothing is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from backends.base import (
    ROUTING_SESSION,
    Backend,
    Call,
    ChatCall,
    CompletionResult,
    CompletionStream,
    DetokenizeCall,
    EmbeddingCall,
    RerankCall,
    TokenizeCall,
    UpstreamCall,
)
from backends.errors import NoReadyWorkerError, UpstreamError, retryable
from backends.vllm.capabilities import vllm_chat_capabilities, vllm_pooling_tables
from backends.vllm.routing.balancer import Balancer, Endpoint
from backends.vllm.routing.prefix import request_keys
from backends.vllm.routing.score import RoutedRequest
from backends.vllm.routing.tokens import PromptTokenizer
from backends.vllm.versions import VLLMChatFeatures
from schemas.config import PoolRoutingConfig
from schemas.endpoints import TOKENIZER_ENDPOINTS
from schemas.endpoints import Endpoint as EndpointKind

__all__ = ["DispatchedBackend", "Dispatcher", "NoReadyWorkerError"]

_T = TypeVar("_T")

# Retry-After for a 503: soon while workers are starting, later when none can.
_RETRY_AFTER_STARTING = 5.0
_RETRY_AFTER_HOPELESS = 30.0


class Dispatcher:
    def __init__(
        self,
        name: str,
        routing: PoolRoutingConfig,
        *,
        on_failure: Callable[[Endpoint, UpstreamError], None],
        hopeless: Callable[[], bool],
        describe: Callable[[], str],
    ) -> None:
        self.name = name
        self.routing = routing
        self.balancer = Balancer(routing)
        # ``score`` with ``prefix: kv-events``: the servers' tokenizer (set by the owner once loaded).
        self.tokenizer: PromptTokenizer | None = None
        self._on_failure = on_failure
        self._hopeless = hopeless
        self._describe = describe
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self.closed = False

    @property
    def endpoints(self) -> list[Endpoint]:
        return self.balancer.endpoints

    def notify(self) -> None:
        """An endpoint became available (or the dispatcher closed): wake waiting calls."""
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """Refuse new calls from now on (calls in flight go on)."""
        self.closed = True
        self.notify()

    def in_flight(self) -> int:
        return sum(ep.in_flight for ep in self.endpoints)

    async def drained(self, within: float) -> bool:
        """After :meth:`close`: wait until no call is in flight (at most ``within`` seconds)."""
        if self.in_flight():
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), within)
        return not self.in_flight()

    def _release(self, ep: Endpoint) -> None:
        ep.end()
        if self.closed and not self.in_flight():
            self._idle.set()

    # --- picking ------------------------------------------------------------------------
    def _keys(self, call: Call[Any]) -> tuple[int, ...]:
        if self.routing.strategy not in ("prefix-affinity", "prefix-hash", "score"):
            return ()
        return request_keys(call.request, self.routing)  # the prompt's (the conversation's) leading part

    def _routed(self, call: Call[Any], keys: tuple[int, ...]) -> RoutedRequest | None:
        """What ``score`` reads besides the keys: the prompt's token ids and the request's session."""
        routing = self.routing
        if routing.strategy != "score":
            return None
        request = call.request
        session = ROUTING_SESSION.get()
        if session is None:
            session = getattr(request, "prompt_cache_key", None) or getattr(request, "user", None)
        tokens = None
        tokenizer = self.tokenizer
        if tokenizer is not None and routing.prefix == "kv-events":
            limit = routing.block_chars * routing.max_blocks
            tokens = tokenizer.prompt_ids(request, limit, routing.block_tokens)
        return RoutedRequest(keys, tokens, session)

    async def _acquire(
        self,
        keys: tuple[int, ...],
        tried: set[tuple[int, int]],
        deadline: float,
        last: UpstreamError | None,
        routed: RoutedRequest | None = None,
    ) -> tuple[Endpoint, Backend]:
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise NoReadyWorkerError(f"backend {self.name!r} is shutting down", backend=self.name)
            ep = self.balancer.pick(keys, tried, routed)
            if ep is not None and ep.adapter is not None:
                ep.begin()
                return ep, ep.adapter
            if last is not None and any(e.available for e in self.endpoints):
                raise last  # every available endpoint failed this call already
            hopeless = self._hopeless()
            remaining = deadline - loop.time()
            if hopeless or remaining <= 0:
                if last is not None:
                    raise last
                raise NoReadyWorkerError(
                    f"no worker of backend {self.name!r} is ready ({self._describe()})",
                    backend=self.name,
                    retry_after=_RETRY_AFTER_HOPELESS if hopeless else _RETRY_AFTER_STARTING,
                )
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                pass

    def _failed(self, ep: Endpoint, exc: UpstreamError, tried: set[tuple[int, int]]) -> None:
        tried.add(ep.ident)
        self._on_failure(ep, exc)

    # --- calls --------------------------------------------------------------------------
    async def complete(self, call: UpstreamCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.complete(call), holds=False)

    async def chat(self, call: ChatCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.chat(call), holds=False)

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.embed(call), holds=False)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.rerank(call), holds=False)

    async def tokenize(self, call: TokenizeCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.tokenize(call), holds=False)

    async def detokenize(self, call: DetokenizeCall) -> CompletionResult:
        return await self._answer(call, lambda adapter, _: adapter.detokenize(call), holds=False)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        return await self._answer(call, lambda adapter, release: _opened(adapter.stream(call), release), holds=True)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        return await self._answer(
            call, lambda adapter, release: _opened(adapter.chat_stream(call), release), holds=True
        )

    async def _answer(
        self, call: Call[Any], send: Callable[[Backend, Callable[[], None]], Awaitable[_T]], *, holds: bool
    ) -> _T:
        """Send ``call`` to endpoints in turn until one answers or a failure is not worth another try.

        ``send`` gets the chosen endpoint's adapter and its release; with ``holds`` (a stream)
        its result keeps the endpoint and releases it when closed, otherwise it is released here.
        """
        keys = self._keys(call)
        routed = self._routed(call, keys)
        tried: set[tuple[int, int]] = set()
        deadline = asyncio.get_running_loop().time() + self.routing.wait_for_ready
        last: UpstreamError | None = None
        for _ in range(self.routing.max_attempts):
            ep, adapter = await self._acquire(keys, tried, deadline, last, routed)
            handed_over = False
            try:
                result = await send(adapter, functools.partial(self._release, ep))
                handed_over = holds
                return result
            except UpstreamError as exc:
                self._failed(ep, exc, tried)
                if not retryable(exc):
                    raise
                last = exc
            finally:
                if not handed_over:
                    self._release(ep)
        assert last is not None
        raise last


async def _opened(opening: Awaitable[CompletionStream], release: Callable[[], None]) -> CompletionStream:
    """The endpoint's stream with its first event read (so a failure before it can move on), holding ``release``."""
    inner = await opening
    try:
        first: bytes | None = await inner.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        await inner.aclose()
        raise
    return _PoolStream(first, inner, release)


class DispatchedBackend(Backend):
    """A backend whose calls a :class:`Dispatcher` spreads over endpoints (``vllm-pool``, multi-server ``vllm``).

    Both endpoints: each endpoint's adapter is a ``vllm`` one, which serves chat; the chat
    table is the endpoints' (their version and tool parser), taken when one becomes ready.
    """

    dispatcher: Dispatcher
    _context_of: Callable[[str], int | None] | None = None  # a ready server's adapter's (take_tables)
    endpoints: frozenset[EndpointKind] = (
        frozenset(
            {
                EndpointKind.COMPLETIONS,
                EndpointKind.CHAT,
                EndpointKind.EMBEDDINGS,
                EndpointKind.RERANK,
                EndpointKind.RESPONSES,
            }
        )
        | TOKENIZER_ENDPOINTS
    )

    def take_tables(self, adapter: Backend) -> None:
        """Every endpoint's table from one server's adapter: the servers behind one backend run
        one vLLM release (a rollout: the newest), so its tables are the backend's."""
        self.capabilities = adapter.capabilities
        self.chat_capabilities = adapter.chat_capabilities
        self.embedding_capabilities = adapter.embedding_capabilities
        self.rerank_capabilities = adapter.rerank_capabilities
        self._context_of = adapter.context_length

    def context_length(self, upstream_model: str) -> int | None:
        return self._context_of(upstream_model) if self._context_of is not None else None

    def unknown_tables(self, tool_parser: str | None) -> None:
        """The tables that cannot fail open, until a server has told its version."""
        self.chat_capabilities = vllm_chat_capabilities(VLLMChatFeatures.of(None, tool_parser))
        self.embedding_capabilities, self.rerank_capabilities = vllm_pooling_tables(None)

    async def complete(self, call: UpstreamCall) -> CompletionResult:
        return await self.dispatcher.complete(call)

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        return await self.dispatcher.stream(call)

    async def chat(self, call: ChatCall) -> CompletionResult:
        return await self.dispatcher.chat(call)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        return await self.dispatcher.chat_stream(call)

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        return await self.dispatcher.embed(call)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        return await self.dispatcher.rerank(call)

    async def tokenize(self, call: TokenizeCall) -> CompletionResult:
        return await self.dispatcher.tokenize(call)

    async def detokenize(self, call: DetokenizeCall) -> CompletionResult:
        return await self.dispatcher.detokenize(call)

    def model_info(self, upstream_model: str) -> dict[str, Any] | None:
        """The first server that knows the model (they serve one model, one release)."""
        for ep in self.dispatcher.endpoints:
            info = ep.adapter.model_info(upstream_model) if ep.adapter is not None else None
            if info:
                return info
        return None

    async def health(self) -> bool:
        return any(ep.available for ep in self.dispatcher.endpoints)


class _PoolStream(CompletionStream):
    """The endpoint's stream with its first event already read; releases the endpoint on close."""

    def __init__(self, first: bytes | None, inner: CompletionStream, release: Callable[[], None]) -> None:
        self._first = first
        self._ended = first is None
        self._inner = inner
        self._release: Callable[[], None] | None = release
        self.usage = inner.usage
        self.finished = inner.finished

    async def __anext__(self) -> bytes:
        first = self._first
        if first is not None:
            self._first = None
            return first
        if self._ended:
            raise StopAsyncIteration
        inner = self._inner
        try:
            return await inner.__anext__()
        finally:
            self.usage = inner.usage
            self.finished = inner.finished

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
