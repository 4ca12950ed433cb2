"""Adapter for a remote vLLM OpenAI-compatible server, faithful across vLLM versions.

The server's version decides how each field is sent (``backends.vllm.versions``,
``backends.vllm.dialect``): read from ``GET /version`` at start-up and again
after the server was unreachable (a restart may be an upgrade) or answered with
another version in its ``system_fingerprint``; a YAML ``version:`` pin stands in
while the endpoint does not answer. Until a version is known the backend uses
the table that cannot fail open (structured output refused). Reading the server
(version, models) is ``backends.vllm.server``'s; embeddings, rerank and the
tokenizer API are ``backends.vllm.pooling``'s: this module is the generating
endpoints.

Cost by request kind:

- *plain* (no field in ``VERSION_DEPENDENT_FIELDS``): the body is sent as the
  client wrote it; the answer is parsed once, rebuilt in OpenAI's shape
  (:func:`~backends.vllm.dialect.normalise_body`) and serialised once; streams
  take the relay's byte path plus one scan per read (``backends.vllm.stream``);
- *translated* (guided_*, best_of == n, ...): the same plus a few dict edits;
- *emulated* (best_of > n, n > 1 at temperature 0 on >= 0.12): see
  ``backends.emulation.best_of``; only these pay for ranking, replication or a per-event parse.

The HTTP side (URLs, headers, POSTs, the stream relay's set-up) is the OpenAI wire
(``backends.openai.wire``), used as a library: this module reads top to bottom, version,
dialect, send, answer, for every endpoint.

Concurrency: one event loop; version refreshes are single-flight (a lock) and
rate-limited. ``close()`` closes the transport.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson

from backends.base import (
    Backend,
    Call,
    ChatCall,
    CompletionResult,
    CompletionStream,
    ResponsesTable,
    UpstreamCall,
)
from backends.capabilities import Capabilities
from backends.chat_capabilities import ChatCapabilities
from backends.emulation.best_of import ReplicatedStream, pick_best_of, replicate_choices, scale_usage
from backends.errors import UpstreamConnectError, UpstreamError, UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.openai.chat import chat_payload, chat_refusal
from backends.openai.relay import usage_of
from backends.openai.wire import OpenAIWire
from backends.pooling_capabilities import PoolingCapabilities
from backends.transport.base import HTTPTransport, UpstreamResponse
from backends.vllm.capabilities import (
    VLLM_CAPABILITIES,
    vllm_chat_capabilities,
    vllm_pooling_tables,
    vllm_responses_capabilities,
)
from backends.vllm.chat import chat_result, replication, translate_chat
from backends.vllm.dialect import (
    GUIDED_TO_STRUCTURED,
    VERSION_DEPENDENT_FIELDS,
    Plan,
    VLLMDialect,
    fingerprint_version,
    format_ignored,
    normalise_body,
    vllm_error,
)
from backends.vllm.pooling import VLLMPoolingCalls
from backends.vllm.server import VLLMServer
from backends.vllm.stream import VLLMChatStreamRelay, VLLMStreamRelay
from backends.vllm.versions import VLLMChatFeatures, VLLMFeatures, VLLMVersion, parse_version
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig
from schemas.endpoints import TOKENIZER_ENDPOINTS, Endpoint
from schemas.errors import UnsupportedParameterError

__all__ = ["VLLMBackend"]

_GUIDES = (*GUIDED_TO_STRUCTURED, "structured_outputs")


class VLLMBackend(VLLMServer, VLLMPoolingCalls, Backend):
    """The version and models (:class:`~backends.vllm.server.VLLMServer`), the pooling and tokenizer
    calls (:class:`~backends.vllm.pooling.VLLMPoolingCalls`) and, here, every generating endpoint."""

    kind: ClassVar[str] = "vllm"
    default_capabilities: ClassVar[Capabilities] = VLLM_CAPABILITIES
    endpoints: frozenset[Endpoint] = (
        frozenset({Endpoint.COMPLETIONS, Endpoint.CHAT, Endpoint.EMBEDDINGS, Endpoint.RERANK, Endpoint.RESPONSES})
        | TOKENIZER_ENDPOINTS
    )
    # Responses through the chat dialect (the table derives from the version's chat table: _use).
    responses_native: ClassVar[bool] = False

    def __init__(self, config: VLLMBackendConfig, transport: HTTPTransport | None = None) -> None:
        super().__init__(config.name, VLLM_CAPABILITIES.with_overrides(config.capabilities))
        self.config = config
        self._wire = OpenAIWire(config, transport)
        self.base_url = self._wire.base_url
        self._tool_parser = config.tool_parser
        self.chat_features = VLLMChatFeatures.of(None, self._tool_parser)
        self._root = self.base_url.removesuffix("/v1")
        self._overrides = config.capabilities
        self._init_server(parse_version(config.version) if config.version else None)
        self._use(self._pin, "pinned" if self._pin else "unknown")

    # --- version ----------------------------------------------------------------------
    def _use(self, version: VLLMVersion | None, source: str) -> None:
        """Switch dialect and capability table (tables are cached per version)."""
        self.version = version
        self.version_source = source
        self.dialect = VLLMDialect.of(version)
        self.capabilities = self.dialect.capabilities.with_overrides(self._overrides)
        self.chat_features = VLLMChatFeatures.of(version, self._tool_parser)
        self.chat_capabilities: ChatCapabilities | None = vllm_chat_capabilities(self.chat_features)
        self.embedding_capabilities: PoolingCapabilities | None
        self.rerank_capabilities: PoolingCapabilities | None
        self.embedding_capabilities, self.rerank_capabilities = vllm_pooling_tables(version)
        self.responses_capabilities: ResponsesTable | None = vllm_responses_capabilities(self.chat_features)

    async def start(self) -> None:
        await super().start()
        await self.detect_version()

    # --- sending ----------------------------------------------------------------------
    # The completions body as the client sent it is the wire's (``completion_fields``); this
    # version's dialect rewrites it. A non-200 answer is read by vLLM's error reader, which
    # keeps ``param`` when it names one of this request's fields.
    async def _send(self, url: str, fields: dict[str, Any], call: Call[Any]) -> bytes:
        """POST and read the whole answer; a failed connection marks the version for a re-read."""

        def status_error(status: int, data: bytes, retry_after: str | None) -> UpstreamError:
            return vllm_error(status, data, retry_after, self.name, call.request)

        try:
            return await self._wire.post_read(url, fields, call, status_error)
        except UpstreamConnectError:
            self._stale = True  # the next contact is a reconnect: re-read the version first
            raise

    async def _open(self, url: str, fields: dict[str, Any], call: Call[Any]) -> UpstreamResponse:
        """POST a streamed request; the 200 response (its relay releases it)."""

        def status_error(status: int, data: bytes, retry_after: str | None) -> UpstreamError:
            return vllm_error(status, data, retry_after, self.name, call.request)

        try:
            return await self._wire.post(url, fields, call, status_error, stream=True)
        except UpstreamConnectError:
            self._stale = True
            raise

    def _parse(self, data: bytes) -> dict[str, Any]:
        try:
            obj = loads_keeping_integers(data, self.name)  # integers beyond 64 bits stay integers
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=self.name) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            raise UpstreamProtocolError("the upstream sent a body without choices", backend=self.name)
        self._saw(obj)
        return obj

    def _result(self, obj: dict[str, Any], call: UpstreamCall) -> CompletionResult:
        out = normalise_body(obj, call.public_model, self.name, call.request)
        return CompletionResult(dumps_exact(out, self.name), usage_of(out["usage"]))

    def _check(self, request: CompletionRequest) -> None:
        """The router's capability check again, against the table of *now* (the version may have changed)."""
        error = self.capabilities.refusal(request, self.name, self.kind)
        if error is not None:
            raise error

    # --- protocol ----------------------------------------------------------------------
    async def complete(self, call: UpstreamCall) -> CompletionResult:
        if self._stale:
            await self._refresh()
        if VERSION_DEPENDENT_FIELDS.isdisjoint(call.request.model_fields_set):
            fields = self._wire.completion_fields(call, self.capabilities)
            data = await self._send(self._wire.completions_url, fields, call)
            return self._result(self._parse(data), call)
        return self._result(await self._complete_planned(call), call)

    async def _complete_planned(self, call: UpstreamCall, *, resent: bool = False) -> dict[str, Any]:
        request = call.request
        self._check(request)
        dialect = self.dialect
        plan, factor = dialect.plan(request)
        if plan is Plan.BEST_OF and request.echo and request.prompt_count > 1:
            return await self._best_of_per_prompt(call)
        fields = self._wire.completion_fields(call, self.capabilities)
        dialect.translate(fields, request, plan, factor)
        obj = self._parse(await self._send(self._wire.completions_url, fields, call))
        if not resent and self._constraint_ignored(request, dialect, obj):
            # The server that answered is not the version the constraint was written for, and it
            # ignores that form: the answer may be unconstrained. Re-read the version and resend once.
            await self.detect_version()
            return await self._complete_planned(call, resent=True)
        if plan is Plan.BEST_OF:
            prompt_tokens = None
            if request.echo:  # one prompt here: its echoed tokens lead every candidate's logprobs
                usage = obj.get("usage") or {}
                prompt_tokens = [int(usage.get("prompt_tokens") or 0)]
            obj["choices"] = pick_best_of(
                obj["choices"],
                best_of=factor,
                n=request.n or 1,
                keep_logprobs=request.logprobs is not None,
                prompt_tokens=prompt_tokens,
            )
        elif plan is Plan.REPLICATE:
            obj["choices"] = replicate_choices(obj["choices"], request.n or 1)
            obj["usage"] = scale_usage(obj.get("usage"), factor)
        return obj

    @staticmethod
    def _constraint_ignored(
        request: CompletionRequest | ChatCompletionRequest, dialect: VLLMDialect, obj: dict[str, Any]
    ) -> bool:
        guided = any(getattr(request, name) is not None for name in _GUIDES)
        if not guided and (request.response_format is None or isinstance(request, ChatCompletionRequest)):
            return False
        seen = fingerprint_version(obj)
        if seen is None or seen == dialect.features.version:
            return False
        server = VLLMFeatures.of(seen)
        if format_ignored(request, dialect.features, server):  # completions' response_format, by version
            return True
        sent_structured = dialect.features.structured_outputs
        return guided and not (server.structured_outputs if sent_structured else server.guided_fields)

    async def _best_of_per_prompt(self, call: UpstreamCall) -> dict[str, Any]:
        """best_of with echo over a batch: one upstream request per prompt, so each prompt's
        length (from its usage) tells where its echoed tokens end; merged in prompt order."""
        request = call.request
        prompts: list[Any] = list(request.prompt)  # a batch here
        trace = call.trace
        calls = [
            UpstreamCall(
                request.model_copy(update={"prompt": p}),
                call.upstream_model,
                call.public_model,
                call.request_id,
                trace.part(i) if trace is not None else None,  # one upstream request each: a span each
            )
            for i, p in enumerate(prompts)
        ]
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._complete_planned(c)) for c in calls]
        n = request.n or 1
        merged: dict[str, Any] | None = None
        totals = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for p, task in enumerate(tasks):
            obj = task.result()
            for choice in obj["choices"]:
                choice["index"] = p * n + int(choice["index"])
            usage = obj.get("usage") or {}
            for key in totals:
                totals[key] += int(usage.get(key) or 0)
            if merged is None:
                merged = obj
            else:
                merged["choices"].extend(obj["choices"])
        assert merged is not None
        merged["usage"] = totals
        return merged

    async def stream(self, call: UpstreamCall) -> CompletionStream:
        if self._stale:
            await self._refresh()
        request = call.request
        plan, factor = Plan.FORWARD, 1
        translated = not VERSION_DEPENDENT_FIELDS.isdisjoint(request.model_fields_set)
        if translated:
            guide = next((name for name in _GUIDES if getattr(request, name) is not None), None)
            if guide is not None and not self.dialect.features.structured_outputs:
                await self._confirm_for_stream(guide)
            self._check(request)
            plan, factor = self.dialect.plan(request)
            if plan is Plan.BEST_OF:  # the schema refuses streaming best_of != n; never get here
                raise UnsupportedParameterError("best_of cannot be streamed", param="best_of", backend=self.name)
        fields = self._wire.completion_fields(call, self.capabilities)
        if translated:
            self.dialect.translate(fields, request, plan, factor)
        resp = await self._open(self._wire.completions_url, fields, call)
        relay = self._wire.relay(VLLMStreamRelay, resp, call)
        if plan is Plan.REPLICATE:
            return ReplicatedStream(relay, request.n or 1, self.name)
        return relay

    # --- chat (translator: backends.vllm.chat) ------------------------------------------
    def _chat_fields(self, call: ChatCall) -> tuple[dict[str, Any], int]:
        """The body for this server (re-checked against the table of *now*) and the copies to make."""
        error = chat_refusal(self.chat_capabilities, call.request, self.name, self.kind)
        if error is not None:
            raise error
        assert self.chat_capabilities is not None  # checked just above (chat_refusal refuses None)
        # vLLM keeps the client's name for the output limit (translate_chat renames it per version).
        stream_usage = self._wire.stream_usage
        fields = chat_payload(call, self.chat_capabilities, max_tokens_field=None, stream_usage=stream_usage)
        copies = replication(call.request, self.chat_features)
        translate_chat(fields, self.chat_features, copies)
        return fields, copies

    async def chat(self, call: ChatCall) -> CompletionResult:
        if self._stale:
            await self._refresh()
        dialect = self.dialect
        fields, copies = self._chat_fields(call)
        obj = self._parse(await self._send(self._wire.chat_url, fields, call))
        if self._constraint_ignored(call.request, dialect, obj):
            # Answered by another version than the constraint was written for: re-read, resend once.
            await self.detect_version()
            fields, copies = self._chat_fields(call)
            obj = self._parse(await self._send(self._wire.chat_url, fields, call))
        return chat_result(obj, call, self.name, copies)

    async def chat_stream(self, call: ChatCall) -> CompletionStream:
        if self._stale:
            await self._refresh()
        guide = next((name for name in _GUIDES if getattr(call.request, name) is not None), None)
        if guide is not None and not self.dialect.features.structured_outputs:
            await self._confirm_for_stream(guide)
        fields, copies = self._chat_fields(call)
        resp = await self._open(self._wire.chat_url, fields, call)
        relay = self._wire.relay(VLLMChatStreamRelay, resp, call)
        return ReplicatedStream(relay, copies, self.name) if copies > 1 else relay

    async def health(self) -> bool:
        return await self._wire.healthy(self._root + "/health")

    async def close(self) -> None:
        await self._wire.close()
