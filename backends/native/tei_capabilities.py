"""What Hugging Face text-embeddings-inference (TEI) honours, one table per endpoint (embeddings, rerank)."""

from __future__ import annotations

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.pooling_capabilities import BINARY_REASON, embedding_table, rerank_table
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS
from schemas.rerank import VLLM_RERANK_EXTRAS

__all__ = ["TEI_EMBEDDINGS", "TEI_RERANK"]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

TEI_EMBEDDINGS = embedding_table(
    N,
    {**dict.fromkeys(VLLM_EMBEDDING_EXTRAS, U), "user": N},
    {"input=token_ids": N, "encoding_format=base64": N, "encoding_format=bytes": U, "encoding_format=bytes_only": U},
    reasons={"encoding_format=bytes": BINARY_REASON, "encoding_format=bytes_only": BINARY_REASON},
)
TEI_RERANK = rerank_table(
    N,
    {**dict.fromkeys(VLLM_RERANK_EXTRAS, U), "model": T, "documents": T, "top_n": E, "return_documents": T,
     "max_tokens_per_doc": U, "user": E},
    {"documents=object": T},
    reasons={"max_tokens_per_doc": "TEI truncates whole pairs only (--auto-truncate), not each document"},
    notes={"user": AUDIT_USER_NOTE, "top_n": "TEI scores every document; the gateway keeps the top n"},
)  # fmt: skip
