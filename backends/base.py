"""The backend protocol every adapter implements.

A backend turns one validated :class:`~schemas.completions.CompletionRequest`
(wrapped in an :class:`UpstreamCall`) into either a finished OpenAI
``text_completion`` body (:meth:`Backend.complete`) or a stream of ready-to-send
SSE events (:meth:`Backend.stream`). Adapters never see raw client JSON and
raise only ``schemas.errors``/``backends.errors`` types.

Lifecycle: ``await start()`` once before serving (opens pools, may probe),
``await close()`` once at shutdown. Methods are called concurrently from one
event loop; adapters are not thread-safe.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

from backends.capabilities import Capabilities
from schemas.completions import CompletionRequest

__all__ = ["Backend", "CompletionResult", "CompletionStream", "TokenUsage", "UpstreamCall"]


@dataclass(slots=True, frozen=True)
class UpstreamCall:
    """One attempt at one route: the request plus what the route decided."""

    request: CompletionRequest
    upstream_model: str  # the upstream's model id (route ``model``)
    public_model: str  # the name the client asked for; every answer carries it
    request_id: str


@dataclass(slots=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int

    def as_json(self) -> dict[str, int]:
        """OpenAI's ``usage`` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(slots=True)
class CompletionResult:
    """A finished non-streaming completion: the client's JSON body, and usage for metrics."""

    body: bytes
    usage: TokenUsage | None


class CompletionStream(ABC):
    """Ready-to-send SSE bytes: whole ``data: {...}\\n\\n`` events in OpenAI's chunk shape.

    Contract:
    - yields non-empty ``bytes``, each one or more complete events; never the final
      ``data: [DONE]``: the gateway writes that itself;
    - ends normally only when the upstream finished cleanly; a cut, a stall or an
      upstream error event raises an ``UpstreamError`` instead, so a truncated
      stream can never look complete;
    - ``usage`` holds the totals once the upstream reported them; ``finished`` turns
      true as soon as the upstream has ended cleanly;
    - ``aclose()`` releases the upstream (closing its connection if unfinished,
      which stops its generation); idempotent, and must be called by the consumer.
    """

    usage: TokenUsage | None = None
    # True once the upstream finished cleanly: the next ``__anext__`` will stop. Lets the
    # consumer send the last chunk, ``[DONE]`` and the end of the body in one write.
    finished: bool = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    @abstractmethod
    async def __anext__(self) -> bytes: ...

    @abstractmethod
    async def aclose(self) -> None: ...


class Backend(ABC):
    """One configured backend entry."""

    kind: ClassVar[str]

    def __init__(self, name: str, capabilities: Capabilities) -> None:
        self.name = name
        self.capabilities = capabilities

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open pools and probe the upstream; called once before serving."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything; called once at shutdown."""

    @abstractmethod
    async def complete(self, call: UpstreamCall) -> CompletionResult:
        """A non-streaming completion."""

    @abstractmethod
    async def stream(self, call: UpstreamCall) -> CompletionStream:
        """Start a streaming completion; returns once the upstream accepted it."""

    async def health(self) -> bool:
        """Whether the upstream answers; used by probes (default: assume healthy)."""
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
