"""Ollama's embeddings: native ``POST /api/embed``.

Request, defaults made explicit: ``{"model", "input": [texts], "truncate": false}`` — Ollama
truncates an over-long input by default, OpenAI refuses it: false keeps OpenAI's meaning (a 400
from Ollama, relayed); ``dimensions`` as given. Text only: token-id input is refused by name
(``input``), never detokenised. Answer ``{"embeddings": [[...]], "prompt_eval_count"}``; floats
only, so ``base64`` is the gateway's. Batches are cut at ``embeddings.max_inputs_per_call``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import TokenUsage
from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.emulation.vectors import check_vectors
from backends.native.common import count
from backends.native.pooling import PartVectors
from backends.pooling_capabilities import embedding_table
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS, EmbeddingRequest

__all__ = ["OLLAMA_EMBEDDINGS", "ollama_embed_answer", "ollama_embed_payload"]

T, E, U = Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED
TEXT_ONLY = "the server embeds text only; token ids are never detokenised by the gateway (send the text)"
NOT_BINARY = "binary answers (application/octet-stream) are vLLM's"

OLLAMA_EMBEDDINGS = embedding_table(
    T,
    {**dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U), "user": E, "encoding_format": T},
    {"input=token_ids": U, "encoding_format=base64": E, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={
        "input=token_ids": TEXT_ONLY,
        "encoding_format=bytes": NOT_BINARY,
        "encoding_format=bytes_only": NOT_BINARY,
    },
    notes={"user": AUDIT_USER_NOTE, "encoding_format=base64": "the gateway encodes the server's floats"},
)


def ollama_embed_payload(request: EmbeddingRequest, model: str, texts: Sequence[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "input": list(texts), "truncate": False}
    if request.dimensions is not None:
        body["dimensions"] = request.dimensions
    return body


def ollama_embed_answer(obj: Any, inputs: int, backend: str) -> PartVectors:
    rows = obj.get("embeddings") if isinstance(obj, dict) else None
    vectors = check_vectors(rows, inputs, backend)
    prompt = count(obj.get("prompt_eval_count"))
    return vectors, None if prompt is None else TokenUsage(prompt, 0)
