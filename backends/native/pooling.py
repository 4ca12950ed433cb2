"""Embeddings on the native servers (Ollama, llama.cpp, TEI): a batch cut at the server's inputs per
call, the parts sent concurrently (bounded), joined in input order with usage summed.

One failed part fails the request with that upstream's error and cancels the rest: nothing is
half-returned. Usage is the servers' counts summed; where one reports none, the gateway's
estimate of the whole request (~4 characters a token; token ids exactly), documented as such.
``base64`` is produced here when the server answered floats.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from backends.base import CompletionResult, EmbeddingCall, TokenUsage
from backends.emulation.vectors import base64_vectors, embedding_list, gather, split
from backends.errors import UpstreamProtocolError
from schemas.config import EmbedBatchingConfig

__all__ = ["PartVectors", "embed_in_parts", "openai_shaped_vectors"]

# One part's answer: its vectors (floats, or base64 strings the server wrote) and its usage.
PartVectors = tuple[list[list[float]] | list[str], TokenUsage | None]


async def embed_in_parts(
    call: EmbeddingCall,
    batching: EmbedBatchingConfig,
    send: Callable[[Sequence[Any]], Awaitable[PartVectors]],
    backend: str,
) -> CompletionResult:
    """OpenAI's answer for ``call``, the inputs sent ``batching.max_inputs_per_call`` at a time."""
    request = call.request
    parts = split(request.inputs, batching.max_inputs_per_call)
    answers = await gather(parts, send, batching.max_parallel_calls)
    vectors: list[Any] = []
    counted = 0
    for part_vectors, part_usage in answers:
        vectors.extend(part_vectors)
        if part_usage is None:
            counted = -1
        elif counted >= 0:
            counted += part_usage.prompt_tokens
    usage = TokenUsage(counted if counted >= 0 else request.prompt_estimate(), 0)
    if request.encoding_format == "base64" and vectors and not isinstance(vectors[0], str):
        vectors = base64_vectors(vectors, backend)
    return CompletionResult(embedding_list(vectors, call.public_model, usage), usage)


def openai_shaped_vectors(obj: Any, count: int, backend: str) -> list[Any]:
    """The ``embedding`` of each ``data`` item of an OpenAI-shaped answer, by ``index``."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or len(data) != count:
        raise UpstreamProtocolError(f"the upstream sent no list of {count} embeddings", backend=backend)
    out: list[Any] = [None] * count
    for position, item in enumerate(data):
        index = item.get("index", position) if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if type(index) is not int or not 0 <= index < count or out[index] is not None:
            raise UpstreamProtocolError("the upstream sent an embedding with a bad index", backend=backend)
        if not (isinstance(vector, str) or (isinstance(vector, list) and vector)):
            raise UpstreamProtocolError("the upstream sent an embedding that is not a vector", backend=backend)
        out[index] = vector
    return out
