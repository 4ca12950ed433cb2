"""The answers of the gateway's own endpoints and of the pooling endpoints, as pydantic models:
``GET /v1/models``, ``/health``, ``/ready``, ``/version``, embeddings, rerank, tokenize and
detokenize. The handlers write these shapes as plain JSON; these models describe them in
``GET /openapi.json`` (:mod:`gateway.http.openapi`). Completions, chat and Responses answers live
beside their requests (``chat_responses``, ``completions_responses``, ``responses_objects``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = [
    "DetokenizeResponse",
    "EmbeddingData",
    "EmbeddingResponse",
    "Health",
    "ModelCard",
    "ModelList",
    "PoolingUsage",
    "Readiness",
    "RerankResponse",
    "RerankResult",
    "TokenizeResponse",
    "Version",
]


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
