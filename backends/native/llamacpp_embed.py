"""llama.cpp's embeddings: ``POST /v1/embeddings`` (``llama-server --embedding``), OpenAI-shaped.

The inputs are sent as given (text or token ids: llama.cpp takes both, as the model's ids) with
``encoding_format: "float"``: servers before base64 support (Dec 2024) answer floats whatever is
asked, so the gateway writes ``base64`` itself. No ``dimensions``. Usage from its ``usage``.
Batches are cut at ``embeddings.max_inputs_per_call``.
Its table: ``backends.native.llamacpp_capabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.emulation.vectors import check_vectors
from backends.native.pooling import PartVectors, openai_shaped_vectors
from backends.openai.pooling import pooling_usage

__all__ = ["llamacpp_embed_answer", "llamacpp_embed_payload"]


def llamacpp_embed_payload(model: str, inputs: Sequence[Any]) -> dict[str, Any]:
    return {"model": model, "input": list(inputs), "encoding_format": "float"}


def llamacpp_embed_answer(obj: Any, inputs: int, backend: str) -> PartVectors:
    vectors = check_vectors(openai_shaped_vectors(obj, inputs, backend), inputs, backend)
    return vectors, pooling_usage(obj.get("usage"))
