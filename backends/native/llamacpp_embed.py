"""llama.cpp's embeddings: ``POST /v1/embeddings`` (``llama-server --embedding``), OpenAI-shaped.

The inputs are sent as given (text or token ids: llama.cpp takes both, as the model's ids) with
``encoding_format: "float"``: servers before base64 support (Dec 2024) answer floats whatever is
asked, so the gateway writes ``base64`` itself. No ``dimensions``. Usage from its ``usage``.
Batches are cut at ``embeddings.max_inputs_per_call``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.emulation.vectors import check_vectors
from backends.native.ollama_embed import NOT_BINARY
from backends.native.pooling import PartVectors, openai_shaped_vectors
from backends.openai.pooling import pooling_usage
from backends.pooling_capabilities import embedding_table
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS

__all__ = ["LLAMACPP_EMBEDDINGS", "llamacpp_embed_answer", "llamacpp_embed_payload"]

N, E, U = Level.NATIVE, Level.EMULATED, Level.UNSUPPORTED

LLAMACPP_EMBEDDINGS = embedding_table(
    N,
    {**dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U), "user": E, "dimensions": U},
    {"input=token_ids": N, "encoding_format=base64": E, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={
        "dimensions": "llama.cpp's server cannot shorten embeddings",
        "encoding_format=bytes": NOT_BINARY,
        "encoding_format=bytes_only": NOT_BINARY,
    },
    notes={"user": AUDIT_USER_NOTE, "encoding_format=base64": "the gateway encodes the server's floats"},
)


def llamacpp_embed_payload(model: str, inputs: Sequence[Any]) -> dict[str, Any]:
    return {"model": model, "input": list(inputs), "encoding_format": "float"}


def llamacpp_embed_answer(obj: Any, inputs: int, backend: str) -> PartVectors:
    vectors = check_vectors(openai_shaped_vectors(obj, inputs, backend), inputs, backend)
    return vectors, pooling_usage(obj.get("usage"))
