"""The Embeddings API wire model: ``POST /v1/embeddings``.

Fields in OpenAI's documented order, then vLLM's pooling extras (0.32's
``EmbeddingCompletionRequest``); the capability tables decide which backend honours which.
Validation is strict and unknown fields are refused by name (``extra="forbid"``), as for
the other endpoints. ``null`` means "the default" and is never forwarded.

Limits from OpenAI's API: at most :data:`MAX_INPUTS` inputs, no empty string, no empty
array. Per-backend limits (tokens per input, inputs per upstream call) live in the tables
and in the adapters, which split a batch where an upstream takes fewer inputs per call.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from schemas.common import CHARS_PER_TOKEN, CountOrMinusOne, Int64, NonEmpty, TokenId

__all__ = [
    "EMBEDDING_NEUTRAL_VALUES",
    "MAX_INPUTS",
    "VLLM_EMBEDDING_EXTRAS",
    "EmbeddingInput",
    "EmbeddingRequest",
    "input_kind",
]

MAX_INPUTS = 2048  # OpenAI: "any array must be 2048 dimensions or less"

TokenIds = Annotated[list[TokenId], Field(min_length=1)]
# The four input forms: text, a batch of texts, token ids, a batch of token-id lists.
EmbeddingInput = (
    NonEmpty
    | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
)

EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields, then vLLM's extras (refused elsewhere by name)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    # --- OpenAI ---------------------------------------------------------------
    input: EmbeddingInput
    model: NonEmpty
    # ``bytes`` and ``bytes_only`` are vLLM's binary answers (application/octet-stream).
    encoding_format: EncodingFormat | None = None
    dimensions: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    user: str | None = None

    # --- vLLM pooling extras -----------------------------------------------------
    truncate_prompt_tokens: CountOrMinusOne | None = None
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: StrictBool | None = None
    embed_dtype: EmbedDType | None = None
    endianness: Literal["native", "big", "little"] | None = None
    use_activation: StrictBool | None = None
    # Before 0.32; 0.32 refuses it ("use use_activation instead"): the vLLM table says which.
    normalize: StrictBool | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    priority: Int64 | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    # --- the request path's common interface (gateway.served.ServedRequest) ---------------
    stream: ClassVar[None] = None
    n: ClassVar[None] = None
    best_of: ClassVar[None] = None
    sequences: ClassVar[int] = 1
    prompt_count: ClassVar[int] = 1  # a batch is answered by one pass, not multiplied like choices
    prompt_array: ClassVar[None] = None  # bounded by MAX_INPUTS in the schema
    output_limit: ClassVar[int] = 0  # nothing is generated
    output_limit_set: ClassVar[bool] = False
    output_bounded: ClassVar[bool] = True
    output_limit_param: ClassVar[str] = "input"
    include_usage: ClassVar[bool] = False

    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set to a non-null value (what an OpenAI-shaped upstream receives)."""
        return self.model_dump(exclude_none=True, exclude_unset=True)

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a batch: one text or one token-id list becomes a batch of one."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]
        return cast("list[str] | list[list[int]]", value)

    @property
    def token_ids(self) -> bool:
        """Whether the input is token ids (one list or a batch of lists)."""
        value = self.input
        return not isinstance(value, str) and not isinstance(value[0], str)

    def prompt_estimate(self) -> int:
        """Tokens of the input: exact for token ids, ~4 characters a token for text."""
        value = self.input
        if isinstance(value, str):
            return len(value) // CHARS_PER_TOKEN + 1
        first = value[0]
        if isinstance(first, int):
            return len(value)
        if isinstance(first, str):
            return sum(len(text) // CHARS_PER_TOKEN + 1 for text in cast("list[str]", value))
        return sum(len(ids) for ids in cast("list[list[int]]", value))

    def routing_text(self) -> str | list[int]:
        """The first input, for prefix routing."""
        return self.inputs[0]


def input_kind(request: EmbeddingRequest) -> str:
    """The input's form, as the capability tables name it: ``text`` or ``token_ids``."""
    return "token_ids" if request.token_ids else "text"


# Fields only vLLM reads (refused by name on every other backend type).
VLLM_EMBEDDING_EXTRAS: frozenset[str] = frozenset(
    tuple(EmbeddingRequest.model_fields)[tuple(EmbeddingRequest.model_fields).index("truncate_prompt_tokens") :]
)

# Values that mean "off": set explicitly, they are no violation on a backend without the feature.
EMBEDDING_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "encoding_format": ("float",),
    "truncate_prompt_tokens": (),
    "add_special_tokens": (True,),
    "embed_dtype": ("float32",),
    "endianness": ("native", "little"),
    "priority": (0,),
    "padding": ("do_not_pad",),
}
