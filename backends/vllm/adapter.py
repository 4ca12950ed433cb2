"""Adapter for a remote vLLM OpenAI-compatible server, faithful across vLLM versions.

The server's version decides how each field is sent (``backends.vllm.versions``,
``backends.vllm.dialect``): read from ``GET /version`` at start-up and again
after the server was unreachable (a restart may be an upgrade) or answered with
another version in its ``system_fingerprint``; a YAML ``version:`` pin stands in
while the endpoint does not answer. Until a version is known the backend uses
the table that cannot fail open (structured output refused).

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
import logging
from typing import Any, ClassVar

import orjson

from backends.base import (
    Backend,
    Call,
    ChatCall,
    CompletionResult,
    CompletionStream,
    DetokenizeCall,
    EmbeddingCall,
    RerankCall,
    ResponsesTable,
    TokenizeCall,
    UpstreamCall,
)
from backends.capabilities import Capabilities
from backends.chat_capabilities import ChatCapabilities
from backends.emulation.best_of import ReplicatedStream, pick_best_of, replicate_choices, scale_usage
from backends.errors import UpstreamConnectError, UpstreamError, UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.openai.chat import chat_payload, chat_refusal
from backends.openai.pooling import embedding_payload, relay_embeddings, rerank_payload, rerank_result
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
from backends.vllm.pooling import binary_embeddings, vllm_pooling_error
from backends.vllm.stream import VLLMChatStreamRelay, VLLMStreamRelay
from backends.vllm.versions import VLLMChatFeatures, VLLMFeatures, VLLMVersion, parse_version
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig
from schemas.endpoints import TOKENIZER_ENDPOINTS, Endpoint
from schemas.errors import UnsupportedParameterError

__all__ = ["VLLMBackend"]

log = logging.getLogger("gateway.vllm")

_DETECT_TIMEOUT = 10.0  # seconds for GET /version (start-up must not hang on a silent server)
_RETRY_INTERVAL = 1.0  # seconds between two detection attempts while the server is unreachable
# A streamed constraint sent as top-level guided_* (< 0.11) would fail open on a server upgraded
# to >= 0.12 behind a kept-alive connection, and a stream cannot be resent once it has started:
# such streams re-confirm a version older than this (seconds) first. Non-streamed answers are
# checked after the fact instead (their system_fingerprint names the version) and resent.
_CONFIRM_AGE = 1.0
_GUIDES = (*GUIDED_TO_STRUCTURED, "structured_outputs")


class VLLMBackend(Backend):
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
        self._pin = parse_version(config.version) if config.version else None
        self._overrides = config.capabilities
        self._lock = asyncio.Lock()
        self._stale = False  # re-read the version before the next request
        self._last_attempt = -_RETRY_INTERVAL
        self._fingerprint: str | None = None
        self._seen: VLLMVersion | None = None  # from the last new system_fingerprint
        self._confirmed_at = -_CONFIRM_AGE  # loop time of the last successful GET /version
        self.version: VLLMVersion | None = None
        self.version_source = "unknown"  # "detected" | "fingerprint" | "pinned" | "unknown"
        self._models: dict[str, dict[str, Any]] = {}  # GET /v1/models: id -> {max_model_len, root}
        self.dialect = VLLMDialect.of(None)
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

    async def detect_version(self) -> VLLMVersion | None:
        """``GET /version``; falls back to the pin (or keeps what it knew) when it gets no version."""
        self._last_attempt = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(_DETECT_TIMEOUT):
                resp = await self._wire.get(self._root + "/version")
                try:
                    data = await resp.read()
                finally:
                    resp.release()
        except (UpstreamError, TimeoutError) as exc:
            self._stale = True  # unreachable: try again before a later request
            log.warning(
                "vLLM backend %s: GET /version failed (%s); using %s version %s",
                self.name,
                exc,
                self.version_source,
                self.dialect.features.label,
            )
            return self.version
        self._stale = False
        await self._read_models()  # reachable: a (re)started server may serve another model or length
        version = None
        if resp.status == 200:
            self._confirmed_at = self._last_attempt
            try:
                answer: Any = orjson.loads(data)
                version = parse_version(str(answer.get("version", ""))) if isinstance(answer, dict) else None
            except orjson.JSONDecodeError:
                version = None
        if version is None and self._seen is not None:
            # No /version (e.g. a proxy exposes only /v1), but the server named itself in an answer.
            self._use(self._seen, "fingerprint")
        elif version is None:
            self._use(self._pin, "pinned" if self._pin else "unknown")
            log.warning(
                "vLLM backend %s: GET /version gave no version (HTTP %s); using %s version %s",
                self.name,
                resp.status,
                self.version_source,
                self.dialect.features.label,
            )
        elif version != self.version or self.version_source != "detected":
            if self._pin and self._pin != version:
                log.warning(
                    "vLLM backend %s: server reports %s, pin says %s; using %s", self.name, version, self._pin, version
                )
            self._use(version, "detected")
            log.info("vLLM backend %s: server version %s", self.name, version)
        return self.version

    async def _read_models(self) -> None:
        """``GET /v1/models``: each served model's ``max_model_len`` (:meth:`context_length`) and ``root``
        (:meth:`model_info`); what it cannot read stays as it was."""
        try:
            async with asyncio.timeout(_DETECT_TIMEOUT):
                resp = await self._wire.get(self.base_url + "/models")
                try:
                    data = await resp.read()
                finally:
                    resp.release()
            listing: Any = orjson.loads(data) if resp.status == 200 else None
        except Exception as exc:  # optional: a failed listing never stops start-up (nor a reconnect)
            log.info("vLLM backend %s: GET /v1/models failed (%s); models keep what was known", self.name, exc)
            return
        entries = listing.get("data") if isinstance(listing, dict) else None
        if isinstance(entries, list):
            self._models = _model_infos(entries)

    def models_listing(self) -> list[dict[str, Any]]:
        """What :meth:`_read_models` learnt, as ``/v1/models`` entries (``id``, ``max_model_len``,
        ``root``): what the control process of ``--workers N`` tells the workers (:meth:`learn_models`)."""
        return [{"id": name, **info} for name, info in self._models.items()]

    def learn_models(self, entries: object) -> None:
        """``/v1/models`` entries read elsewhere (a worker's adapter: by the control process); else no change."""
        if isinstance(entries, list):
            self._models = _model_infos(entries)

    def model_info(self, upstream_model: str) -> dict[str, Any] | None:
        return self._models.get(upstream_model)

    def context_length(self, upstream_model: str) -> int | None:
        info = self._models.get(upstream_model)
        return None if info is None else info.get("max_model_len")

    async def _refresh(self) -> None:
        async with self._lock:
            if self._stale and asyncio.get_running_loop().time() - self._last_attempt >= _RETRY_INTERVAL:
                await self.detect_version()

    def _confirmed_recently(self) -> bool:
        return asyncio.get_running_loop().time() - self._confirmed_at <= _CONFIRM_AGE

    def _saw(self, obj: dict[str, Any]) -> None:
        """Notice a changed ``system_fingerprint`` (``vllm-X.Y.Z-...``): the server may have been replaced."""
        fingerprint = obj.get("system_fingerprint")
        if fingerprint != self._fingerprint and isinstance(fingerprint, str):
            self._fingerprint = fingerprint
            seen = fingerprint_version(obj)
            if seen is not None and seen != self.version:
                self._seen = seen
                self._stale = True

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

    async def _confirm_for_stream(self, guide: str) -> None:
        """A streamed constraint in the old (top-level guided_*) form needs a version read just now."""
        if not self._confirmed_recently():
            asked = asyncio.get_running_loop().time()
            async with self._lock:
                # Single flight: streams that queued behind a GET /version begun after they asked
                # take its answer (whatever it was) instead of each sending their own.
                if self._last_attempt < asked and not self._confirmed_recently():
                    await self.detect_version()
        if self.version_source != "detected" and not self.dialect.features.structured_outputs:
            raise UnsupportedParameterError(
                f"'{guide}' cannot be streamed by backend '{self.name}': its vLLM version ({self.version_source} "
                f"{self.dialect.features.label}) cannot be confirmed by GET /version, and a vLLM >= 0.12 would "
                "ignore this form of the constraint; send the request without stream",
                param=guide,
                backend=self.name,
            )

    # --- embeddings and rerank (translator: backends.openai.pooling, vLLM's tables: backends.vllm.pooling)
    async def _send_pooling(self, url: str, fields: dict[str, Any], call: Call[Any]) -> tuple[bytes, Any]:
        """POST a pooling request; the body and the response (for its headers). A non-200 raises."""

        def status_error(status: int, data: bytes, retry_after: str | None) -> UpstreamError:
            return vllm_pooling_error(status, data, retry_after, self.name)

        if self._stale:
            await self._refresh()
        try:
            resp = await self._wire.post(url, fields, call, status_error, stream=False)
        except UpstreamConnectError:
            self._stale = True  # the next contact is a reconnect: re-read the version first
            raise
        try:
            return await resp.read(), resp
        finally:
            resp.release()

    def _refuse(self, error: UnsupportedParameterError | None) -> None:
        if error is not None:  # the table of *now*: the version may have changed since routing
            raise error

    async def embed(self, call: EmbeddingCall) -> CompletionResult:
        table = self.embedding_capabilities
        assert table is not None
        self._refuse(table.refusal(call.request, self.name, self.kind))
        data, resp = await self._send_pooling(self._wire.embeddings_url, embedding_payload(call, table), call)
        if call.request.encoding_format in ("bytes", "bytes_only"):
            estimate = call.request.prompt_estimate()
            return binary_embeddings(data, resp.header("metadata"), call.public_model, estimate)
        return relay_embeddings(data, call, self.name)

    async def rerank(self, call: RerankCall) -> CompletionResult:
        table = self.rerank_capabilities
        assert table is not None
        self._refuse(table.refusal(call.request, self.name, self.kind))
        data, _ = await self._send_pooling(self._wire.rerank_url, rerank_payload(call, table), call)
        return rerank_result(data, call, self.name)

    # --- vLLM's tokenizer API: POST /tokenize, /detokenize on the server's root ---------------------
    async def tokenize(self, call: TokenizeCall) -> CompletionResult:
        return await self._tokenizer("/tokenize", call)

    async def detokenize(self, call: DetokenizeCall) -> CompletionResult:
        return await self._tokenizer("/detokenize", call)

    async def _tokenizer(self, path: str, call: TokenizeCall | DetokenizeCall) -> CompletionResult:
        """The answer as vLLM wrote it (it names no model); nothing generated, no tokens counted."""
        fields = call.request.upstream_fields()
        fields["model"] = call.upstream_model
        data, _ = await self._send_pooling(self._root + path, fields, call)
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise UpstreamProtocolError(f"the upstream's {path} answer is not a JSON object", backend=self.name)
        return CompletionResult(data, None)

    async def health(self) -> bool:
        return await self._wire.healthy(self._root + "/health")

    async def close(self) -> None:
        await self._wire.close()


def _model_infos(entries: list[Any]) -> dict[str, dict[str, Any]]:
    """``/v1/models`` entries -> id -> ``{max_model_len, root}``, each kept only when well typed."""
    models: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            length, root = entry.get("max_model_len"), entry.get("root")
            info: dict[str, Any] = {}
            if type(length) is int and length > 0:
                info["max_model_len"] = length
            if type(root) is str:
                info["root"] = root
            models[entry["id"]] = info
    return models
