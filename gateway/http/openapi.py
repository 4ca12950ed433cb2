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
from typing import Any, Literal

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from gateway.security.auth import AuthenticationError, KeyRing, presented_key
from gateway.version import gateway_version
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
from schemas.stored_responses import INCLUDABLE, InputItemList, ResponseDeleted
from schemas.tokenize import DetokenizeRequest, TokenizeRequest

__all__ = ["build_openapi", "openapi_handler"]

_REF = "#/components/schemas/{model}"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    endpoints: list[str]
    max_model_len: int | None = None  # models on vLLM routes, as the server reports it
    root: str | None = None


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "draining"]


class Readiness(BaseModel):
    status: Literal["ready", "not_ready", "draining"]
    reason: Literal["no_routable_backend"] | None = None


_EXPLORER = {
    "get": {
        "operationId": "apiExplorer",
        "summary": "This document in an API explorer (Swagger UI, served by the gateway: no CDN)",
        "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
    }
}


class Version(BaseModel):
    version: str


class EmbeddingData(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32


class PoolingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: PoolingUsage


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: PoolingUsage
    results: list[RerankResult]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": _REASONS[status],
            "content": {"application/json": {"schema": _ref("ErrorEnvelope")}},
        }
        for status in statuses
    }


_REASONS = {
    400: "Invalid request: malformed JSON, a field out of range, a rule broken, an unsupported field or a request cap",
    401: "Missing or unknown API key",
    403: "The key may not use this model (admin endpoints: no auth.admin_key configured)",
    404: "Unknown model, or a model not served on this endpoint; a response id unknown to this key",
    408: "The request body arrived too slowly",
    413: "The request body is too large",
    415: "The request's Content-Encoding is not supported",
    429: "Rate limited (per key), the key's budget spent, the gateway at capacity, or the upstream's 429",
    500: "A gateway bug (details only in its log)",
    502: "The upstream failed or refused our credentials",
    503: "The upstream or the gateway is unavailable",
    504: "The upstream timed out",
}

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
            "content": {
                "application/json": {"schema": _ref(spec.request), "example": {"model": model, **spec.example}}
            },
        },
        "responses": {
            "200": {
                "description": "The answer; with stream=true, server-sent events of its chunks",
                "headers": headers,
                "content": {
                    "application/json": {"schema": _ref(spec.response)},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **_errors(400, *((401, 403) if auth else ()), 404, 408, 413, 415, 429, 500, 502, 503, 504),
        },
    }


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
_INCLUDE = _query(
    "include",
    {"type": "array", "items": {"type": "string", "enum": list(INCLUDABLE)}},
    "Accepted as OpenAI's; a stored response is returned as answered (also sent as include[])",
)


def _stored_operations(auth: bool) -> dict[str, Any]:
    """The stored-response endpoints (``gateway.http.stored_responses``)."""
    refusals = _errors(400, *((401, 403) if auth else ()), 404, 503)

    def answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"200": {"description": description, "content": {"application/json": {"schema": schema}}}, **refusals}

    return {
        "/v1/responses/{response_id}": {
            "get": {
                "operationId": "getResponse",
                "summary": "A response this key stored (store: true); another key's is a 404",
                "parameters": [
                    _RESPONSE_ID,
                    _INCLUDE,
                    _query("include_obfuscation", {"type": "boolean"}, "Only changes streamed events"),
                    _query("stream", {"type": "boolean"}, "true is refused: stored responses are not replayed"),
                    _query("starting_after", {"type": "integer", "minimum": 0}, "Refused (streamed retrieve only)"),
                ],
                "responses": answer("The Response object as it was answered", {"type": "object"}),
            },
            "delete": {
                "operationId": "deleteResponse",
                "summary": "Delete a response this key stored",
                "parameters": [_RESPONSE_ID],
                "responses": answer("Deleted", _ref("ResponseDeleted")),
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "operationId": "listInputItems",
                "summary": "The input items of a response this key stored, a page at a time",
                "parameters": [
                    _RESPONSE_ID,
                    _query("after", {"type": "string", "maxLength": 256}, "List the items after this item id"),
                    _query("before", {"type": "string", "maxLength": 256}, "List the items before this item id"),
                    _INCLUDE,
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}, "Page size"),
                    _query("order", {"type": "string", "enum": ["asc", "desc"], "default": "desc"}, "Item order"),
                ],
                "responses": answer("A page of input items", _ref("InputItemList")),
            }
        },
    }


def _answer(spec: _Generation, model: str, headers: dict[str, Any], auth: bool) -> dict[str, Any]:
    operation = _generation(spec, model, headers, auth)
    operation["responses"]["200"] = {
        "description": "The answer",
        "headers": headers,
        "content": {"application/json": {"schema": _ref(spec.response)}},
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
        ref_template=_REF,
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
    models: dict[str, Any] = {
        "operationId": "listModels",
        "summary": "The models this gateway serves (with auth on: those the key may use)",
        "responses": {
            "200": {
                "description": "OpenAI list of models",
                "headers": headers,
                "content": {"application/json": {"schema": _ref("ModelList")}},
            },
            **(_errors(401) if auth is not None else {}),
        },
    }
    model: dict[str, Any] = {
        "operationId": "retrieveModel",
        "summary": "One model (404 alike for a model that does not exist and one the key may not use)",
        "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
        "responses": {
            "200": {
                "description": "OpenAI model object",
                "headers": headers,
                "content": {"application/json": {"schema": _ref("ModelCard")}},
            },
            **_errors(*((401,) if auth is not None else ()), 404),
        },
    }
    version: dict[str, Any] = {
        "operationId": "version",
        "summary": "The gateway's version",
        "responses": {
            "200": {"description": "The version", "content": {"application/json": {"schema": _ref("Version")}}},
            **(_errors(401) if auth is not None else {}),
        },
    }
    stored = _stored_operations(auth is not None)
    if api_security:
        for operation in [
            *generations.values(),
            model,
            version,
            *(op for ops in stored.values() for op in ops.values()),
        ]:
            operation["security"] = api_security
        models["security"] = api_security
    metrics: dict[str, Any] = {
        "operationId": "metrics",
        "summary": "Prometheus metrics",
        "responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            **(_errors(401) if metrics_security else {}),
        },
    }
    if metrics_security:
        metrics["security"] = metrics_security
    health_answer = {"application/json": {"schema": _ref("Health")}}
    ready_answer = {"application/json": {"schema": _ref("Readiness")}}
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
            "/v1/models": {"get": models},
            **stored,
            "/v1/models/{model}": {"get": model},
            "/version": {"get": version},
            "/health": {
                "get": {
                    "operationId": "health",
                    "summary": "Liveness (503 while draining)",
                    "responses": {
                        "200": {"description": "Serving", "content": health_answer},
                        "503": {"description": "Draining", "content": health_answer},
                    },
                }
            },
            "/ready": {
                "get": {
                    "operationId": "ready",
                    "summary": "Readiness: some model has a route that can take a request now (503 while "
                    "draining or when none can)",
                    "responses": {
                        "200": {"description": "Ready", "content": ready_answer},
                        "503": {"description": "Draining, or no routable backend", "content": ready_answer},
                    },
                }
            },
            "/metrics": {"get": metrics},
            **({"/docs": _EXPLORER} if config.server.api_explorer else {}),
            **_admin_paths(api_security),
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
        },
        "components": components,
    }


def _admin_paths(security: list[dict[str, list[str]]]) -> dict[str, Any]:
    """The operators' endpoints (gateway.http.admin): with auth on, behind ``auth.admin_key``."""
    paths: dict[str, Any] = {}
    for path, operation_id, summary in (
        ("/admin/health", "adminHealth", "Deep health: each backend's circuit, last probe, version, models"),
        ("/admin/keys", "adminKeys", "Each key's spend (day, month, total) and budget"),
    ):
        operation: dict[str, Any] = {
            "operationId": operation_id,
            "summary": summary,
            "responses": {
                "200": {"description": summary, "content": {"application/json": {"schema": {"type": "object"}}}},
                **(_errors(401, 403) if security else {}),
            },
        }
        if security:
            operation["security"] = security
        paths[path] = {"get": operation}
    return paths


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
