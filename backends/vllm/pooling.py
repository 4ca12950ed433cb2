"""vLLM's embeddings and rerank: the OpenAI family's translator plus vLLM's pooling extras, by version.

vLLM serves ``/v1/embeddings`` and ``/v1/rerank`` for pooling models (``--runner pooling``).
Its pooling extras are forwarded where the server's version has them and refused by name
where it does not, because vLLM ignores unknown fields (HTTP 200, the field silently dropped):
a base64 answer in float32 for a client that asked float16 would decode to garbage.

First versions (:data:`POOLING_BOUNDARIES`): 0.32.0 from its wheel
(``vllm/entrypoints/pooling``); the earlier ones from vLLM's pull requests (the encoding
options landed in October 2025, so 0.12.0 is the first release sure to have them). An unknown
version gets the extras every pooling server has had (``truncate_prompt_tokens``,
``add_special_tokens``, ``dimensions``) and nothing that could fail open.

Binary answers (``encoding_format: "bytes"`` / ``"bytes_only"``): the body is relayed as sent
(``application/octet-stream``); ``bytes`` carries its metadata (with the model, and usage) in
a ``metadata`` header, whose model is swapped to the client's name.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from backends.base import CompletionResult, TokenUsage
from backends.capabilities import Level
from backends.errors import UpstreamStatusError, error_from_upstream_body
from backends.openai.pooling import pooling_usage
from backends.pooling_capabilities import PoolingCapabilities, embedding_table, rerank_table
from backends.vllm.versions import VLLMVersion
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS
from schemas.rerank import VLLM_RERANK_EXTRAS

__all__ = ["POOLING_BOUNDARIES", "binary_embeddings", "vllm_pooling_error", "vllm_pooling_tables"]

N, T, U = Level.NATIVE, Level.TRANSLATED, Level.UNSUPPORTED

# First version with each pooling extra (the key is the field, or ``field=form``).
POOLING_BOUNDARIES: dict[str, VLLMVersion] = {
    "embed_dtype": VLLMVersion(0, 12, 0),
    "endianness": VLLMVersion(0, 12, 0),
    "encoding_format=bytes": VLLMVersion(0, 12, 0),
    "encoding_format=bytes_only": VLLMVersion(0, 12, 0),
    "use_activation": VLLMVersion(0, 12, 0),
    "priority": VLLMVersion(0, 12, 0),
    "truncation_side": VLLMVersion(0, 32, 0),
    "padding": VLLMVersion(0, 32, 0),
    "cache_salt": VLLMVersion(0, 32, 0),
    "max_tokens_per_query": VLLMVersion(0, 32, 0),
    "max_tokens_per_doc": VLLMVersion(0, 32, 0),
    "instruction": VLLMVersion(0, 32, 0),
}
# ``normalize``: honoured from 0.10.2 until 0.32 refused it ("use use_activation instead").
NORMALIZE_SINCE, NORMALIZE_UNTIL = VLLMVersion(0, 10, 2), VLLMVersion(0, 32, 0)
_UNKNOWN = "the vLLM server's version is unknown (GET /version failed and the backend has no `version:` pin), so "


def _missing(key: str, version: VLLMVersion | None) -> str | None:
    """Why ``key`` is refused on ``version`` (None: honoured)."""
    first = POOLING_BOUNDARIES[key]
    if version is None:
        return _UNKNOWN + f"the gateway cannot tell whether it has {key.split('=')[-1]} (vLLM >= {first})"
    if version < first:
        return f"vLLM {version} has no {key.split('=')[-1]} (first in {first})"
    return None


def _normalize_reason(version: VLLMVersion | None) -> str | None:
    if version is None:
        return _UNKNOWN + "the gateway cannot tell whether it has normalize"
    if version >= NORMALIZE_UNTIL:
        return f"vLLM {version} removed normalize; use use_activation (false: not normalised)"
    if version < NORMALIZE_SINCE:
        return f"vLLM {version} has no normalize (first in {NORMALIZE_SINCE})"
    return None


@lru_cache(maxsize=32)
def vllm_pooling_tables(version: VLLMVersion | None) -> tuple[PoolingCapabilities, PoolingCapabilities]:
    """The embeddings and rerank tables of one vLLM version (cached)."""
    levels: dict[str, Level] = dict.fromkeys(VLLM_EMBEDDING_EXTRAS, N)
    forms: dict[str, Level] = {"input=token_ids": N, "encoding_format=base64": N}
    reasons: dict[str, str] = {}
    for key in (k for k in POOLING_BOUNDARIES if k.split("=")[0] in levels or "=" in k):
        why = _missing(key, version)
        if why is None:
            if "=" in key:
                forms[key] = N
            continue
        reasons[key] = why
        if "=" in key:
            forms[key] = U
        else:
            levels[key] = U
    normalize = _normalize_reason(version)
    if normalize is not None:
        levels["normalize"], reasons["normalize"] = U, normalize
    embeddings = embedding_table(N, levels, forms, reasons=reasons)

    rerank_levels: dict[str, Level] = {**dict.fromkeys(VLLM_RERANK_EXTRAS, N), "return_documents": T}
    rerank_reasons: dict[str, str] = {}
    for name in (*VLLM_RERANK_EXTRAS, "max_tokens_per_doc"):
        why = _missing(name, version) if name in POOLING_BOUNDARIES else None
        if why is not None:
            rerank_levels[name], rerank_reasons[name] = U, why
    rerank = rerank_table(N, rerank_levels, {"documents=object": T}, reasons=rerank_reasons)
    return embeddings, rerank


_POOLING_PARAMS = {"input_tokens": "input", "prompt": "input", "messages": "input"}


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
