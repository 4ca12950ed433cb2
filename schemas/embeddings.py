"""The Embeddings API wire model: ``POST /v1/embeddings``.

Fields in OpenAI's documented order, then vLLM's pooling extras (0.32's
``EmbeddingCompletionRequest``) and its chat-style request (``messages``: one conversation or a
batch of them, rendered by the model's chat template, and the template's options); the capability
tables decide which backend honours which. Exactly one of ``input`` and ``messages``.
Validation is strict and unknown fields are refused by name (``extra="forbid"``), as for
the other endpoints. ``null`` means "the default" and is never forwarded.

Limits from OpenAI's API: at most :data:`MAX_INPUTS` inputs, no empty string, no empty
array. Per-backend limits (tokens per input, inputs per upstream call) live in the tables
and in the adapters, which split a batch where an upstream takes fewer inputs per call.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from schemas.chat_messages import AssistantMessage, ChatMessage, message_text, message_upstream_fields
from schemas.common import CHARS_PER_TOKEN, Answered, CountOrMinusOne, FieldRules, Int64, JsonObject, NonEmpty, TokenId
from schemas.errors import FieldRuleError

__all__ = [
    "EMBEDDING_NEUTRAL_VALUES",
    "MAX_INPUTS",
    "VLLM_EMBEDDING_EXTRAS",
    "Conversation",
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

# vLLM's chat-style input: a conversation (embedded as one input), or a batch of them.
Conversation = Annotated[list[ChatMessage], Field(min_length=1)]
Conversations = Annotated[list[Conversation], Field(min_length=1, max_length=MAX_INPUTS)]

EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]


class EmbeddingRequest(Answered, BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields, then vLLM's extras (refused elsewhere by name)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    # --- OpenAI ---------------------------------------------------------------
    input: EmbeddingInput | None = None  # required unless vLLM's ``messages`` is given
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
    # vLLM's chat-style embeddings (``EmbeddingChatRequest``): instead of ``input``.
    messages: Conversation | Conversations | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    chat_template: NonEmpty | None = None
    chat_template_kwargs: JsonObject | None = None

    # --- the request path's common interface (gateway.served.ServedRequest; the rest: Answered) ------
    output_limit_param: ClassVar[str] = "input"

    # --- cross-field rules ----------------------------------------------------------------------
    @model_validator(mode="after")
    def check_rules(self) -> EmbeddingRequest:
        """``input`` or ``messages`` (one of them); the chat template's options only with ``messages``."""
        if self.input is None:
            if self.messages is None:
                raise FieldRuleError("input", "input is required (or vLLM's chat-style messages)")
        elif self.messages is not None:
            raise FieldRuleError("messages", "input and messages cannot both be set: send one")
        _RULES.run(self, self.__pydantic_fields_set__)
        return self

    def _check_chat_options(self) -> None:
        if self.messages is None:
            name = next((n for n in _CHAT_OPTIONS if getattr(self, n) is not None), None)
            if name is None:  # set, but to null: "the default"
                return
            raise FieldRuleError(name, f"{name} applies to messages (vLLM's chat-style embeddings) only")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldRuleError(
                "continue_final_message", "continue_final_message and add_generation_prompt cannot both be true"
            )
        if self.continue_final_message and not all(isinstance(c[-1], AssistantMessage) for c in self.conversations):
            raise FieldRuleError(
                "continue_final_message", "continue_final_message needs the last message to be the assistant's"
            )

    # --- helpers for the request path ------------------------------------------------------------
    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set to a non-null value (what an OpenAI-shaped upstream receives)."""
        if self.messages is None:
            return self.model_dump(exclude_none=True, exclude_unset=True)
        out = self.model_dump(exclude_none=True, exclude_unset=True, exclude={"messages"})
        conversations = [[message_upstream_fields(m) for m in c] for c in self.conversations]
        out["messages"] = conversations if self.batched_messages else conversations[0]
        return out

    @property
    def batched_messages(self) -> bool:
        """Whether ``messages`` is a batch of conversations (vLLM >= 0.32), not one."""
        messages = self.messages
        return messages is not None and isinstance(messages[0], list)

    @property
    def conversations(self) -> list[list[ChatMessage]]:
        """``messages`` as a batch of conversations (none without ``messages``)."""
        messages = self.messages
        if messages is None:
            return []
        return cast("list[list[ChatMessage]]", messages if isinstance(messages[0], list) else [messages])

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a batch: one text or one token-id list becomes a batch of one (none with ``messages``)."""
        value = self.input
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]
        return cast("list[str] | list[list[int]]", value)

    @property
    def token_ids(self) -> bool:
        """Whether the input is token ids (one list or a batch of lists)."""
        value = self.input
        return value is not None and not isinstance(value, str) and not isinstance(value[0], str)

    def prompt_estimate(self) -> int:
        """Tokens of the input: exact for token ids, ~4 characters a token for text and messages."""
        value = self.input
        if value is None:
            conversations = self.conversations
            chars = sum(len(message_text(m)) for c in conversations for m in c)
            return chars // CHARS_PER_TOKEN + sum(3 * len(c) + 3 for c in conversations)
        if isinstance(value, str):
            return len(value) // CHARS_PER_TOKEN + 1
        first = value[0]
        if isinstance(first, int):
            return len(value)
        if isinstance(first, str):
            return sum(len(text) // CHARS_PER_TOKEN + 1 for text in cast("list[str]", value))
        return sum(len(ids) for ids in cast("list[list[int]]", value))

    def routing_text(self) -> str | list[int]:
        """The first input (the first conversation's text), for prefix routing."""
        if self.input is None:
            return "".join(f"<{m.role}>{message_text(m)}" for m in self.conversations[0])
        return self.inputs[0]


_CHAT_OPTIONS = ("add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs")
_RULES: FieldRules[EmbeddingRequest] = FieldRules((frozenset(_CHAT_OPTIONS), EmbeddingRequest._check_chat_options))


def input_kind(request: EmbeddingRequest) -> str:
    """The input's form, as the capability tables name it: ``text``, ``token_ids`` or ``messages``."""
    if request.input is None:
        return "messages"
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
