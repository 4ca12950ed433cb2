"""The Rerank API wire model: ``POST /v1/rerank`` (and ``/v2/rerank``), the shape vLLM, TEI, Jina and Cohere share.

A query and documents (strings, or objects with a ``text``) in; the documents' relevance
scores out, sorted by relevance, each with its ``index`` in the request. Strict like the
other endpoints; vLLM's extras are refused by name on other backends.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from schemas.common import CHARS_PER_TOKEN, Answered, CountOrMinusOne, Int64, NonEmpty

__all__ = ["MAX_DOCUMENTS", "RERANK_NEUTRAL_VALUES", "VLLM_RERANK_EXTRAS", "RerankDocument", "RerankRequest"]

MAX_DOCUMENTS = 10_000  # Cohere's documented bound (1,000 recommended)


class RerankDocument(BaseModel):
    """A document as an object (Cohere v1, Jina): its text."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    text: str


class RerankRequest(Answered, BaseModel):
    """``POST /v1/rerank``: Cohere's and Jina's fields, then vLLM's extras."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    model: NonEmpty
    query: NonEmpty
    documents: Annotated[list[str | RerankDocument], Field(min_length=1, max_length=MAX_DOCUMENTS)]
    # 0 or unset: every document (vLLM reads 0 so).
    top_n: Annotated[StrictInt, Field(ge=0, le=MAX_DOCUMENTS)] | None = None
    # Unset: the documents come back (vLLM and Jina always return them; Cohere's v2 default is false).
    return_documents: StrictBool | None = None
    # Cohere v2: documents longer are truncated to this many tokens.
    max_tokens_per_doc: Annotated[StrictInt, Field(ge=0)] | None = None
    user: str | None = None

    # --- vLLM extras ------------------------------------------------------------------------
    truncate_prompt_tokens: CountOrMinusOne | None = None
    truncation_side: Literal["left", "right"] | None = None
    use_activation: StrictBool | None = None
    max_tokens_per_query: Annotated[StrictInt, Field(ge=0)] | None = None
    instruction: str | None = None
    priority: Int64 | None = None

    # --- the request path's common interface (gateway.served.ServedRequest; the rest: Answered) ------
    output_limit_param: ClassVar[str] = "documents"

    @property
    def texts(self) -> list[str]:
        """The documents' texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]

    @property
    def wants_documents(self) -> bool:
        return self.return_documents is not False

    @property
    def top(self) -> int:
        """How many results to return (every document when ``top_n`` is unset or 0)."""
        n = self.top_n
        return len(self.documents) if not n else min(n, len(self.documents))

    def prompt_estimate(self) -> int:
        """~4 characters a token over every (query, document) pair, as the upstreams count them."""
        query = len(self.query) // CHARS_PER_TOKEN + 1
        return sum(query + len(text) // CHARS_PER_TOKEN + 1 for text in self.texts)

    def routing_text(self) -> str:
        return self.query


VLLM_RERANK_EXTRAS: frozenset[str] = frozenset(
    tuple(RerankRequest.model_fields)[tuple(RerankRequest.model_fields).index("truncate_prompt_tokens") :]
)

RERANK_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "return_documents": (True,),
    "top_n": (0,),
    "max_tokens_per_doc": (0,),
    "max_tokens_per_query": (0,),
    "priority": (0,),
}
