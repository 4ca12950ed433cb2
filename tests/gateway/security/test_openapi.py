"""``GET /openapi.json``: served, valid OpenAPI 3.1, generated from the pydantic schemas themselves."""

from __future__ import annotations

import aiohttp
import schemathesis

from schemas.completions import CompletionRequest
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL
from tests.gateway.security.conftest import METRICS_KEY, MakeSecureGateway, auth_section


async def fetch(url: str) -> dict:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/openapi.json") as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            return await resp.json()  # type: ignore[no-any-return]


async def test_document_describes_the_endpoints(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway()
    doc = await fetch(gw.url)
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/models/{model}",
        "/version",
        "/health",
        "/ready",
        "/metrics",
        "/admin/health",
        "/admin/keys",
        "/openapi.json",
        "/docs",
    }
    responses = doc["paths"]["/v1/responses"]["post"]
    assert responses["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponsesRequest"
    }
    assert responses["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponseObject"
    }
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert chat["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionResponse"
    }
    assert "ChatCompletionChunk" in doc["components"]["schemas"]
    for path, request in (("/v1/embeddings", "EmbeddingRequest"), ("/v1/rerank", "RerankRequest"),
                          ("/tokenize", "TokenizeRequest"), ("/detokenize", "DetokenizeRequest")):  # fmt: skip
        operation = doc["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{request}"
        }
        assert set(operation["responses"]["200"]["content"]) == {"application/json"}
    post = doc["paths"]["/v1/completions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionRequest"
    }
    assert {"application/json", "text/event-stream"} <= set(post["responses"]["200"]["content"])
    assert post["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorEnvelope")
    assert "security" not in post  # auth off: no security requirement
    assert "securitySchemes" not in doc["components"]
    # the configured models are the examples of "model"
    model = doc["components"]["schemas"]["CompletionRequest"]["properties"]["model"]
    assert set(model["examples"]) == {OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL}
    schemathesis.openapi.from_dict(doc)  # loads as a valid document


async def test_request_schema_is_the_pydantic_schema(secure_gateway: MakeSecureGateway) -> None:
    """Not a hand-written copy: the same fields, bounds and required set the validator uses."""
    gw = await secure_gateway()
    doc = await fetch(gw.url)
    served = doc["components"]["schemas"]["CompletionRequest"]
    generated = CompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    served["properties"]["model"].pop("examples")
    assert served["properties"] == generated["properties"]
    assert served["required"] == generated["required"] == ["model"]
    # prompt, or vLLM's prompt_embeds in its place (the validator's rule)
    assert served["anyOf"] == generated["anyOf"] == [{"required": ["prompt"]}, {"required": ["prompt_embeds"]}]
    assert served["additionalProperties"] is False


async def test_security_schemes_with_auth_on(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(extra=f"  metrics_key: {METRICS_KEY}\n"))
    doc = await fetch(gw.url)  # the document itself needs no key
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <key>"}
    assert schemes["apiKeyHeader"] == {"type": "apiKey", "in": "header", "name": "api-key"}
    for path, method in (
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/models", "get"),
        ("/metrics", "get"),
        ("/admin/health", "get"),
        ("/admin/keys", "get"),
    ):
        operation = doc["paths"][path][method]
        assert operation["security"] == [{"bearer": []}, {"apiKeyHeader": []}]
        assert "401" in operation["responses"]
    assert "security" not in doc["paths"]["/health"]["get"]
    assert "x-ratelimit-remaining-requests" in doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["headers"]
