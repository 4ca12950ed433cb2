"""vLLM's tokenizer API: ``POST /tokenize`` and ``POST /detokenize`` (0.32's ``serve/tokenize``).

``/tokenize`` takes either a text (``prompt``: vLLM's completion-style request) or a conversation
(``messages``, rendered by the model's chat template: its chat-style request, with the template's
options and ``tools``); it answers ``{"count", "max_model_len", "tokens", "token_strs"}``.
``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``. Strict like every endpoint (unknown
fields refused by name); ``model`` is required (it picks the route; vLLM's is optional). Nothing is
generated, so the requests reserve no tokens against a key's limits.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from schemas.chat_messages import AssistantMessage, ChatMessage, FunctionTool, message_text, message_upstream_fields
from schemas.common import Answered, JsonObject, NonEmpty, TokenId
from schemas.errors import FieldRuleError

__all__ = ["DetokenizeRequest", "TokenizeRequest"]

_CHAT_OPTIONS = ("add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs", "tools")


class _TokenizerRequest(Answered, BaseModel):
    """The request path's common interface (``gateway.served.ServedRequest``): nothing generated."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    user: ClassVar[None] = None

    def prompt_estimate(self) -> int:
        """Nothing reaches a model: no tokens are reserved or counted."""
        return 0

    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set to a non-null value (what vLLM receives)."""
        return self.model_dump(exclude_none=True, exclude_unset=True, by_alias=True)


class TokenizeRequest(_TokenizerRequest):
    """``POST /tokenize``: ``prompt`` (completion-style) or ``messages`` (chat-style), not both."""

    model: NonEmpty
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool | None = None
    # chat-style only
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    chat_template: NonEmpty | None = None
    chat_template_kwargs: JsonObject | None = None
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)] | None = None

    output_limit_param: ClassVar[str] = "prompt"

    @model_validator(mode="after")
    def check_rules(self) -> TokenizeRequest:
        if self.messages is None:
            if self.prompt is None:
                raise FieldRuleError("prompt", "prompt (or messages, for a conversation) is required")
            name = next((n for n in _CHAT_OPTIONS if getattr(self, n) is not None), None)
            if name is not None:
                raise FieldRuleError(name, f"{name} applies to messages (a chat-style tokenize request) only")
            return self
        if self.prompt is not None:
            raise FieldRuleError("messages", "prompt and messages cannot both be set: send one")
        if self.continue_final_message:
            if self.add_generation_prompt:
                raise FieldRuleError(
                    "continue_final_message", "continue_final_message and add_generation_prompt cannot both be true"
                )
            if not isinstance(self.messages[-1], AssistantMessage):
                raise FieldRuleError(
                    "continue_final_message", "continue_final_message needs the last message to be the assistant's"
                )
        return self

    def upstream_fields(self) -> dict[str, Any]:
        if self.messages is None:
            return super().upstream_fields()
        out = self.model_dump(exclude_none=True, exclude_unset=True, by_alias=True, exclude={"messages"})
        out["messages"] = [message_upstream_fields(m) for m in self.messages]
        return out

    def routing_text(self) -> str:
        """The text (the conversation's roles and texts), for prefix routing."""
        if self.messages is None:
            return self.prompt or ""
        return "".join(f"<{m.role}>{message_text(m)}" for m in self.messages)


class DetokenizeRequest(_TokenizerRequest):
    """``POST /detokenize``: token ids back to text."""

    model: NonEmpty
    tokens: list[TokenId]

    output_limit_param: ClassVar[str] = "tokens"

    def routing_text(self) -> list[int]:
        return self.tokens
