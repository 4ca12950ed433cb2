"""The OpenAPI operations of the gateway's own endpoints (models, version, health, readiness,
metrics, this document, the explorer, the admin endpoints) and of the stored-response endpoints,
with the pieces every operation shares (:func:`ref`, :func:`errors`); the generation endpoints'
operations and the document itself are :mod:`gateway.http.openapi`'s.
"""

from __future__ import annotations

from typing import Any

from schemas.stored_responses import INCLUDABLE

__all__ = ["EXPLORER", "OPENAPI", "REF", "admin_paths", "errors", "own_operations", "query", "ref", "stored_operations"]

REF = "#/components/schemas/{model}"


EXPLORER = {
    "get": {
        "operationId": "apiExplorer",
        "summary": "This document in an API explorer (Swagger UI, served by the gateway: no CDN)",
        "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
    }
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": _REASONS[status],
            "content": {"application/json": {"schema": ref("ErrorEnvelope")}},
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


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
_INCLUDE = query(
    "include",
    {"type": "array", "items": {"type": "string", "enum": list(INCLUDABLE)}},
    "Accepted as OpenAI's; a stored response is returned as answered (also sent as include[])",
)


def stored_operations(auth: bool) -> dict[str, Any]:
    """The stored-response endpoints (``gateway.http.stored_responses``)."""
    refusals = errors(400, *((401, 403) if auth else ()), 404, 503)

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
                    query("include_obfuscation", {"type": "boolean"}, "Only changes streamed events"),
                    query("stream", {"type": "boolean"}, "true is refused: stored responses are not replayed"),
                    query("starting_after", {"type": "integer", "minimum": 0}, "Refused (streamed retrieve only)"),
                ],
                "responses": answer("The Response object as it was answered", {"type": "object"}),
            },
            "delete": {
                "operationId": "deleteResponse",
                "summary": "Delete a response this key stored",
                "parameters": [_RESPONSE_ID],
                "responses": answer("Deleted", ref("ResponseDeleted")),
            },
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "operationId": "listInputItems",
                "summary": "The input items of a response this key stored, a page at a time",
                "parameters": [
                    _RESPONSE_ID,
                    query("after", {"type": "string", "maxLength": 256}, "List the items after this item id"),
                    query("before", {"type": "string", "maxLength": 256}, "List the items before this item id"),
                    _INCLUDE,
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}, "Page size"),
                    query("order", {"type": "string", "enum": ["asc", "desc"], "default": "desc"}, "Item order"),
                ],
                "responses": answer("A page of input items", ref("InputItemList")),
            }
        },
    }


def admin_paths(security: list[dict[str, list[str]]]) -> dict[str, Any]:
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
                **(errors(401, 403) if security else {}),
            },
        }
        if security:
            operation["security"] = security
        paths[path] = {"get": operation}
    return paths


def own_operations(
    headers: dict[str, Any],
    auth: bool,
    api_security: list[dict[str, list[str]]],
    metrics_security: list[dict[str, list[str]]],
) -> dict[str, dict[str, Any]]:
    """The paths of the gateway's own GET endpoints: models, version, health, readiness, metrics;
    ``api_security`` on the first two (empty: auth off), ``metrics_security`` on ``/metrics``."""
    models: dict[str, Any] = {
        "operationId": "listModels",
        "summary": "The models this gateway serves (with auth on: those the key may use)",
        "responses": {
            "200": {
                "description": "OpenAI list of models",
                "headers": headers,
                "content": {"application/json": {"schema": ref("ModelList")}},
            },
            **(errors(401) if auth else {}),
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
                "content": {"application/json": {"schema": ref("ModelCard")}},
            },
            **errors(*((401,) if auth else ()), 404),
        },
    }
    version: dict[str, Any] = {
        "operationId": "version",
        "summary": "The gateway's version",
        "responses": {
            "200": {"description": "The version", "content": {"application/json": {"schema": ref("Version")}}},
            **(errors(401) if auth else {}),
        },
    }
    metrics: dict[str, Any] = {
        "operationId": "metrics",
        "summary": "Prometheus metrics",
        "responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            **(errors(401) if metrics_security else {}),
        },
    }
    health_answer = {"application/json": {"schema": ref("Health")}}
    ready_answer = {"application/json": {"schema": ref("Readiness")}}
    if api_security:
        for operation in (models, model, version):
            operation["security"] = api_security
    if metrics_security:
        metrics["security"] = metrics_security
    return {
        "/v1/models": {"get": models},
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
    }


OPENAPI = {
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
}
