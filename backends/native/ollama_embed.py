"""Ollama's embeddings: native ``POST /api/embed``.

Request, defaults made explicit: ``{"model", "input": [texts], "truncate": false}`` — Ollama
truncates an over-long input by default, OpenAI refuses it: false keeps OpenAI's meaning (a 400
from Ollama, relayed); ``dimensions`` as given. Text only: token-id input is refused by name
(``input``), never detokenised. Answer ``{"embeddings": [[...]], "prompt_eval_count"}``; floats
only, so ``base64`` is the gateway's. Batches are cut at ``embeddings.max_inputs_per_call``.
Its table: ``backends.native.ollama_capabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import TokenUsage
from backends.emulation.vectors import check_vectors
from backends.native.common import count
from backends.native.pooling import PartVectors
from schemas.embeddings import EmbeddingRequest

__all__ = ["ollama_embed_answer", "ollama_embed_payload"]


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
