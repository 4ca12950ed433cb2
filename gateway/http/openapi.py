"""``GET /openapi.json``: an OpenAPI 3.1 description of this gateway, generated from its pydantic schemas.

The request bodies are each endpoint's own pydantic model's JSON schema (the one that
validates requests), the answers are the response models and
:class:`~schemas.errors.ErrorEnvelope`. The document is built once per app from the config
(the security schemes appear when auth is on) and served as ready bytes. Schemathesis runs
against it in the tests.

The configured model names are the ``model`` examples only where the caller may see them, as
``GET /v1/models`` decides: with auth off, all of them; with auth on, none for an anonymous
caller (or one with an unknown key: the document itself needs no key) and, for a valid key,
only the models that key may use. A model name can be a secret of its own (a customer's
fine-tune), so the document never lists one the caller could not list otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic.json_schema import models_json_schema

from gateway.http.openapi_own import (
    EXPLORER,
    OPENAPI,
    REF,
    admin_paths,
    errors,
    own_operations,
    ref,
    stored_operations,
)
from gateway.security.auth import AuthenticationError, KeyRing, presented_key
from gateway.version import gateway_version
from schemas.answers import (
    DetokenizeResponse,
    EmbeddingResponse,
    Health,
    ModelList,
    Readiness,
    RerankResponse,
    TokenizeResponse,
    Version,
)
from schemas.chat import ChatCompletionRequest
from schemas.chat_responses import ChatCompletionChunk, ChatCompletionResponse
from schemas.completions import CompletionRequest, CompletionResponse
from schemas.config import GatewayConfig
from schemas.embeddings import EmbeddingRequest
from schemas.endpoints import ENDPOINT_ALIASES, ENDPOINT_PATHS, Endpoint
from schemas.errors import ErrorEnvelope
from schemas.rerank import RerankRequest
from schemas.responses import ResponsesRequest
from schemas.responses_objects import ResponseObject, ResponseStreamEvent
from schemas.stored_responses import InputItemList, ResponseDeleted
from schemas.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = ["build_openapi", "openapi_handler"]

_RATE_HEADERS = {
    name: {"description": "Per-key rate limit state (keys with limits only)", "schema": {"type": "string"}}
    for name in (
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    )
}
_REQUEST_ID = {"x-request-id": {"description": "The request's id (also sent upstream)", "schema": {"type": "string"}}}


_EXAMPLE_MODEL = "your-model"  # the request example's model when the caller may see none


@dataclass(frozen=True)
class _Generation:
    """What one generation endpoint's operation says; the rest of the operation is common."""

    operation_id: str
    summary: str
    request: str  # component names (the pydantic models' own)
    response: str
    example: dict[str, Any]  # without "model"


# The other POST endpoints (no stream): request and answer components, summary, example.
_ANSWERS = {
    ENDPOINT_PATHS[Endpoint.EMBEDDINGS]: _Generation(
        "createEmbedding", "OpenAI Embeddings (and vLLM's chat-style request on vLLM routes)",
        "EmbeddingRequest", "EmbeddingResponse", {"input": "The food was delicious"},
    ),
    ENDPOINT_PATHS[Endpoint.RERANK]: _Generation(
        "rerank", "Rerank documents by relevance to a query (Cohere's, Jina's, vLLM's API; also /v2/rerank, /rerank)",
        "RerankRequest", "RerankResponse", {"query": "a fox", "documents": ["a quick fox", "a lazy dog"]},
    ),
    ENDPOINT_PATHS[Endpoint.TOKENIZE]: _Generation(
        "tokenize", "vLLM's /tokenize (models on vLLM routes): a prompt's or a conversation's token ids",
        "TokenizeRequest", "TokenizeResponse", {"prompt": "Say this is a test"},
    ),
    ENDPOINT_PATHS[Endpoint.DETOKENIZE]: _Generation(
        "detokenize", "vLLM's /detokenize (models on vLLM routes): token ids back to text",
        "DetokenizeRequest", "DetokenizeResponse", {"tokens": [1, 2, 3]},
    ),
}  # fmt: skip

_GENERATIONS = {
    ENDPOINT_PATHS[Endpoint.COMPLETIONS]: _Generation(
        "createCompletion",
        "OpenAI Completions: a completion, or a stream of chunks (data-only SSE ending in [DONE])",
        "CompletionRequest",
        "CompletionResponse",
        {"prompt": "Say this is a test", "max_tokens": 8},
    ),
    ENDPOINT_PATHS[Endpoint.CHAT]: _Generation(
        "createChatCompletion",
        "OpenAI Chat Completions: a chat.completion, or a stream of chat.completion.chunk (SSE ending in [DONE])",
        "ChatCompletionRequest",
        "ChatCompletionResponse",
        {"messages": [{"role": "user", "content": "Say this is a test"}], "max_completion_tokens": 8},
    ),
    ENDPOINT_PATHS[Endpoint.RESPONSES]: _Generation(
        "createResponse",
        "OpenAI Responses: a Response, or a stream of Responses events (sequence_number from 0, no [DONE])",
        "ResponsesRequest",
        "ResponseObject",
        {"input": "Say this is a test", "max_output_tokens": 16},
    ),
}


def _generation(spec: _Generation, model: str, headers: dict[str, Any], auth: bool) -> dict[str, Any]:
    return {
        "operationId": spec.operation_id,
        "summary": spec.summary,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref(spec.request), "example": {"model": model, **spec.example}}},
        },
        "responses": {
            "200": {
                "description": "The answer; with stream=true, server-sent events of its chunks",
                "headers": headers,
                "content": {
                    "application/json": {"schema": ref(spec.response)},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **errors(400, *((401, 403) if auth else ()), 404, 408, 413, 415, 429, 500, 502, 503, 504),
        },
    }


def _answer(spec: _Generation, model: str, headers: dict[str, Any], auth: bool) -> dict[str, Any]:
    operation = _generation(spec, model, headers, auth)
    operation["responses"]["200"] = {
        "description": "The answer",
        "headers": headers,
        "content": {"application/json": {"schema": ref(spec.response)}},
    }
    return operation


def build_openapi(config: GatewayConfig, visible: list[str] | None = None) -> dict[str, Any]:
    """The document; ``visible`` are the model names the caller may see (default: every configured one)."""
    _, schemas = models_json_schema(
        [
            (CompletionRequest, "validation"),
            (CompletionResponse, "validation"),
            (ChatCompletionRequest, "validation"),
            (ChatCompletionResponse, "validation"),
            (ChatCompletionChunk, "validation"),
            (ResponsesRequest, "validation"),
            (ResponseObject, "validation"),
            (ResponseStreamEvent, "validation"),
            (ErrorEnvelope, "validation"),
            (ModelList, "validation"),
            (Health, "validation"),
            (Readiness, "validation"),
            (InputItemList, "validation"),
            (ResponseDeleted, "validation"),
            (Version, "validation"),
            (EmbeddingRequest, "validation"),
            (EmbeddingResponse, "validation"),
            (RerankRequest, "validation"),
            (RerankResponse, "validation"),
            (TokenizeRequest, "validation"),
            (TokenizeResponse, "validation"),
            (DetokenizeRequest, "validation"),
            (DetokenizeResponse, "validation"),
        ],
        ref_template=REF,
    )
    components: dict[str, Any] = {"schemas": schemas["$defs"]}
    names = [model.name for model in config.models] if visible is None else visible
    if names:
        for spec in (*_GENERATIONS.values(), *_ANSWERS.values()):
            components["schemas"][spec.request]["properties"]["model"]["examples"] = names

    auth = config.auth
    api_security: list[dict[str, list[str]]] = []
    metrics_security: list[dict[str, list[str]]] = []
    if auth is not None:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <key>"},
            "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "api-key"},
        }
        api_security = [{"bearer": []}, {"apiKeyHeader": []}]
        if auth.metrics_sha256 is not None:
            metrics_security = api_security

    headers = {**_REQUEST_ID, **(_RATE_HEADERS if auth is not None else {})}
    example_model = names[0] if names else _EXAMPLE_MODEL
    generations = {
        path: _generation(spec, example_model, headers, auth is not None) for path, spec in _GENERATIONS.items()
    }
    generations |= {path: _answer(spec, example_model, headers, auth is not None) for path, spec in _ANSWERS.items()}
    stored = stored_operations(auth is not None)
    own = own_operations(headers, auth is not None, api_security, metrics_security)
    if api_security:
        for operation in [*generations.values(), *(op for ops in stored.values() for op in ops.values())]:
            operation["security"] = api_security
    # The rerank endpoint's other paths (Cohere's /v2/rerank, Jina's /rerank): the same operation.
    rerank = generations[ENDPOINT_PATHS[Endpoint.RERANK]]
    for alias in ENDPOINT_ALIASES[Endpoint.RERANK]:
        generations[alias] = {**rerank, "operationId": "rerank" + alias.replace("/", "_")}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "completions-gateway",
            "version": gateway_version(),
            "description": (
                "An OpenAI-compatible LLM gateway: Completions, Chat Completions, Responses, embeddings and "
                "rerank (and vLLM's tokenizer on vLLM routes) over OpenAI-compatible APIs, vLLM, TGI, Ollama, "
                "llama.cpp and TEI. Every request is checked against a strict schema and what its backend can "
                "honour; a field it cannot is refused by name."
            ),
        },
        "paths": {
            **{path: {"post": operation} for path, operation in generations.items()},
            "/v1/models": own.pop("/v1/models"),
            **stored,
            **own,
            **({"/docs": EXPLORER} if config.server.api_explorer else {}),
            **admin_paths(api_security),
            "/openapi.json": OPENAPI,
        },
        "components": components,
    }


def openapi_handler(config: GatewayConfig, keyring: KeyRing | None = None) -> Handler:
    """The route's handler; ``keyring`` when auth is on (the model names then follow the key)."""
    if keyring is None:
        body = orjson.dumps(build_openapi(config))

        async def openapi(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        return openapi

    anonymous = orjson.dumps(build_openapi(config, visible=[]))
    configured = [model.name for model in config.models]
    per_key: dict[str, bytes] = {}  # built on a key's first request; bounded by the configured keys

    async def openapi_with_auth(request: web.Request) -> web.Response:
        body = anonymous
        if presented_key(request.headers) is not None:
            try:
                key = keyring.identify(request.headers)
            except AuthenticationError:
                pass  # an unknown key sees what an anonymous caller sees
            else:
                body = per_key.get(key.name) or per_key.setdefault(
                    key.name, orjson.dumps(build_openapi(config, [n for n in configured if n in key.models]))
                )
        return web.Response(body=body, content_type="application/json")

    return openapi_with_auth
