"""What the request path reads of a chat request, beyond its fields: the output limit, the choices, the
prompt's size and routing text (``gateway.served.ServedRequest``, shared with the other endpoints).

:class:`ChatServed` is a mixin of :class:`~schemas.chat.ChatCompletionRequest` (no fields, no state):
its properties read the request's fields only, so a request's answer to them never changes.
"""

from __future__ import annotations

from typing import Protocol

from schemas.chat_messages import ChatMessage, FunctionDefinition, ResponseFormat, Tool, ToolMessage, message_text
from schemas.chat_options import ChatStreamOptions
from schemas.common import CHARS_PER_TOKEN

__all__ = ["UNSET_OUTPUT_ESTIMATE", "ChatServed"]

# What an unset max_tokens/max_completion_tokens counts as for rate limits and the max_tokens cap.
UNSET_OUTPUT_ESTIMATE = 16


class _ChatView(Protocol):
    """The fields (and the limit) :class:`ChatServed` reads: ``ChatCompletionRequest``'s, read-only."""

    @property
    def messages(self) -> list[ChatMessage]: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def max_completion_tokens(self) -> int | None: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def n(self) -> int | None: ...
    @property
    def stream_options(self) -> ChatStreamOptions | None: ...
    @property
    def tools(self) -> list[Tool] | None: ...
    @property
    def response_format(self) -> ResponseFormat | None: ...
    @property
    def functions(self) -> list[FunctionDefinition] | None: ...


class ChatServed:
    """The request path's view of a chat request (a mixin: :class:`~schemas.chat.ChatCompletionRequest`)."""

    __slots__ = ()

    @property
    def effective_n(self: _ChatView) -> int:
        return self.n or 1

    @property
    def max_output_tokens(self: _ChatView) -> int | None:
        """The client's output limit, whichever of the two names carried it (never both)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tool_results(self: _ChatView) -> list[ToolMessage]:
        return [m for m in self.messages if isinstance(m, ToolMessage)]

    @property
    def output_limit(self: _ChatView) -> int:
        """Tokens each choice may generate, as far as the gateway can know: the client's limit, or
        :data:`UNSET_OUTPUT_ESTIMATE` when unset (the upstream then stops at the context length;
        rate limits settle from the real usage)."""
        limit = self.max_output_tokens
        return UNSET_OUTPUT_ESTIMATE if limit is None else limit

    @property
    def output_limit_set(self: _ChatView) -> bool:
        return self.max_output_tokens is not None

    @property
    def output_bounded(self: _ChatView) -> bool:
        """Whether the client bounded the output (unset, a chat reply may run to the context length)."""
        return self.max_output_tokens is not None

    @property
    def output_limit_param(self: _ChatView) -> str:
        """The field that carries (or would carry) the output limit."""
        return "max_tokens" if self.max_tokens is not None else "max_completion_tokens"

    @property
    def best_of(self: _ChatView) -> None:
        """Chat has no ``best_of``: every sequence generated is a choice."""
        return None

    @property
    def sequences(self: _ChatView) -> int:
        return self.n or 1

    @property
    def prompt_count(self: _ChatView) -> int:
        return 1  # one conversation per request

    @property
    def prompt_array(self: _ChatView) -> None:
        return None  # a conversation, never a batch of prompts

    @property
    def include_usage(self: _ChatView) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def prompt_estimate(self: _ChatView) -> int:
        """~4 characters a token over the messages (text, tool calls), the tools and the response
        format, plus OpenAI's few tokens of framing per message."""
        chars = sum(len(message_text(m)) for m in self.messages)
        for extra in (self.tools, self.response_format, self.functions):
            if extra is not None:
                chars += len(str(extra))
        return chars // CHARS_PER_TOKEN + 3 * len(self.messages) + 3

    def routing_text(self: _ChatView) -> str:
        """The conversation's leading part (roles and texts in order), for prefix routing."""
        return "".join(f"<{m.role}>{message_text(m)}" for m in self.messages)
