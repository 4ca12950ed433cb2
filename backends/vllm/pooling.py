"""vLLM's embeddings and rerank: the OpenAI family's translator plus vLLM's pooling extras.

vLLM serves ``/v1/embeddings`` and ``/v1/rerank`` for pooling models (``--runner pooling``).
Which extras a version honours is its tables' (``backends.vllm.capabilities.vllm_pooling_tables``).

Binary answers (``encoding_format: "bytes"`` / ``"bytes_only"``): the body is relayed as sent
(``application/octet-stream``); ``bytes`` carries its metadata (with the model, and usage) in
a ``metadata`` header, whose model is swapped to the client's name.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, TokenUsage
from backends.errors import UpstreamStatusError, error_from_upstream_body
from backends.openai.pooling import pooling_usage

__all__ = ["binary_embeddings", "vllm_pooling_error"]

_POOLING_PARAMS = {"input_tokens": "input", "prompt": "input"}


def vllm_pooling_error(status: int, body: bytes, retry_after: str | None, backend: str) -> UpstreamStatusError:
    """Our error for a vLLM pooling error answer, with vLLM's names for fields made ours."""
    return error_from_upstream_body(status, body, retry_after, backend, rename=lambda p: _POOLING_PARAMS.get(p, p))


def binary_embeddings(data: bytes, metadata: str | None, public_model: str, estimate: int) -> CompletionResult:
    """vLLM's binary answer relayed: the bytes as sent, the ``metadata`` header with the client's model.

    Usage is the metadata's; ``bytes_only`` has none, so the gateway's ``estimate`` is accounted.
    """
    usage: TokenUsage | None = TokenUsage(estimate, 0)
    headers: dict[str, str] | None = None
    if metadata is not None:
        try:
            meta: Any = orjson.loads(metadata)
        except orjson.JSONDecodeError:
            meta = None
        if isinstance(meta, dict):
            meta["model"] = public_model
            usage = pooling_usage(meta.get("usage")) or usage
            headers = {"metadata": orjson.dumps(meta).decode()}
        else:
            headers = {"metadata": metadata}
    return CompletionResult(data, usage, content_type="application/octet-stream", headers=headers)
