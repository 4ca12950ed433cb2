"""The mock's embeddings and rerank: deterministic vectors and scores, no model
(tables: ``backends.mock.capabilities``).

A vector is the input's words (or token ids) hashed into :data:`MOCK_DIMENSIONS` signed buckets
and normalised (feature hashing): the same text always gets the same vector, and texts that share
words point the same way, so a quick start can show similarity without a model. ``dimensions``
keeps the leading ones, normalised again (as matryoshka models do). Usage counts words, as the
mock's completions do. Rerank scores a document by the cosine of its vector with the query's.
"""

from __future__ import annotations

import hashlib
import math
import struct

from backends.base import CompletionResult, EmbeddingCall, RerankCall, TokenUsage
from backends.emulation.rerank import rerank_answer
from backends.emulation.vectors import base64_vectors, embedding_list
from backends.mock.capabilities import MOCK_DIMENSIONS

__all__ = ["mock_embed", "mock_rerank", "mock_vector"]


def _words(item: str | list[int]) -> list[str]:
    if isinstance(item, str):
        words = item.lower().split()
        return words or [item]
    return [str(token) for token in item]


def mock_vector(item: str | list[int], dims: int = MOCK_DIMENSIONS) -> list[float]:
    """The input's vector: its words hashed into signed buckets, normalised (unit length)."""
    vector = [0.0] * MOCK_DIMENSIONS
    for word in _words(item):
        digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "little") % MOCK_DIMENSIONS
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    vector = vector[:dims]
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:  # every word of the input fell outside the kept dimensions
        vector[0], norm = 1.0, 1.0
    # float32 values, as a real model's: the base64 form is then exactly the float form.
    return float32_round([x / norm for x in vector])


def float32_round(vector: list[float]) -> list[float]:
    """``vector`` rounded to float32 values (what an engine's tensors hold)."""
    packer = struct.Struct(f"<{len(vector)}f")
    return list(packer.unpack(packer.pack(*vector)))


def mock_embed(call: EmbeddingCall) -> CompletionResult:
    request = call.request
    dims = request.dimensions or MOCK_DIMENSIONS
    inputs = request.inputs
    vectors = [mock_vector(item, dims) for item in inputs]
    usage = TokenUsage(sum(len(_words(item)) for item in inputs), 0)
    encoded = base64_vectors(vectors, "mock") if request.encoding_format == "base64" else vectors
    return CompletionResult(embedding_list(encoded, call.public_model, usage), usage)


def mock_rerank(call: RerankCall) -> CompletionResult:
    request = call.request
    query = mock_vector(request.query)
    texts = request.texts
    scores = [(i, sum(a * b for a, b in zip(query, mock_vector(t), strict=True))) for i, t in enumerate(texts)]
    usage = TokenUsage(sum(len(_words(request.query)) + len(_words(t)) for t in texts), 0)
    return rerank_answer(scores, request, call.public_model, f"rerank-{call.request_id}", usage)
