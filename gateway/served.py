"""The small interface the request path needs from a validated request of either endpoint.

Both :class:`~schemas.completions.CompletionRequest` and :class:`~schemas.chat.ChatCompletionRequest`
implement it (methods on the schema models), so the guard, the request caps, the rate limiter, the
router and the accounting never ask which endpoint a request came from. A module of its own,
below ``gateway.flow`` and ``gateway.security``, so both can use it without importing each other.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ServedRequest"]


class ServedRequest(Protocol):
    """The small interface the request path needs from a validated request of any endpoint."""

    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool | None: ...
    @property
    def n(self) -> int | None: ...
    @property
    def best_of(self) -> int | None: ...
    @property
    def user(self) -> str | None:
        """OpenAI's end-user id: the audit line records it (``gateway.security.audit``)."""

    @property
    def sequences(self) -> int:
        """Sequences generated per prompt (``max(n, best_of)``)."""

    @property
    def prompt_count(self) -> int: ...
    @property
    def prompt_array(self) -> list[Any] | None:
        """The prompt when it is an array (bounded by ``server.max_prompt_array``), else None."""

    @property
    def output_limit(self) -> int:
        """Tokens each sequence may generate (the endpoint's default or estimate when unset)."""

    @property
    def output_limit_set(self) -> bool:
        """Whether the client set the output limit."""

    @property
    def output_bounded(self) -> bool:
        """False when the client left the output unbounded (chat without a max)."""

    @property
    def output_limit_param(self) -> str:
        """The request field that carries the output limit, for errors."""

    @property
    def include_usage(self) -> bool: ...
    def prompt_estimate(self) -> int: ...
    def routing_text(self) -> str | list[int]: ...
