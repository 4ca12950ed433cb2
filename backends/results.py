"""What a backend gives back: a finished answer (:class:`CompletionResult`) or a stream of
ready-to-send events (:class:`CompletionStream`), and the token usage either reports.

Every adapter's translators build these; the gateway reads them to answer the client, settle
rate limits and budgets, and count metrics. :func:`usage_of` is the one reading of an upstream's
``usage`` object: a count it cannot trust is no usage. Importable from :mod:`backends.base` too,
with the protocol that returns them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CompletionResult", "CompletionStream", "TokenUsage", "usage_of"]


@dataclass(slots=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int
    # Of ``prompt_tokens``, those the upstream read from its prompt cache (OpenAI's
    # ``prompt_tokens_details.cached_tokens``, a Response's ``input_tokens_details``): priced at the
    # cached-input rate (gateway.spend). 0 when the upstream did not say.
    cached_tokens: int = 0

    def as_json(self) -> dict[str, int]:
        """OpenAI's ``usage`` object."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


_MAX_COUNT = 1 << 32  # a token count past this is an upstream's lie, not usage (native: common.count)


def usage_of(
    obj: Any, prompt_key: str = "prompt_tokens", completion_key: str = "completion_tokens"
) -> TokenUsage | None:
    """The token counts of an upstream ``usage`` object, when both are counts: integers in [0, 2^32).

    Anything else (negative, a bool, a float, 2^62 or 2^64+1 from a hostile upstream) is no
    usage: settling a key's token budget with it would lock the key out for ages. The keys are
    chat's and completions'; a Response's usage says ``input_tokens`` and ``output_tokens``.
    Cached prompt tokens come from ``<prompt_key>_details.cached_tokens`` when that is a count no
    larger than the prompt (else 0: a cached count is never trusted beyond the prompt it is part of).
    """
    if type(obj) is dict:
        prompt = obj.get(prompt_key)
        completion = obj.get(completion_key)
        if (
            type(prompt) is int
            and type(completion) is int
            and 0 <= prompt < _MAX_COUNT
            and 0 <= completion < _MAX_COUNT
        ):
            details_key = "input_tokens_details" if prompt_key == "input_tokens" else "prompt_tokens_details"
            if details_key in obj:  # ``in`` and ``[]``, not ``get``: no call for the usage that has none
                details = obj[details_key]
                if type(details) is dict and "cached_tokens" in details:
                    cached = details["cached_tokens"]
                    if type(cached) is int and 0 < cached <= prompt:
                        return TokenUsage(prompt, completion, cached)
            return TokenUsage(prompt, completion)
    return None


@dataclass(slots=True)
class CompletionResult:
    """A finished non-streaming answer: the client's body (JSON unless ``content_type`` says
    otherwise, e.g. vLLM's binary embeddings, with their ``headers``), and usage for metrics."""

    body: bytes
    usage: TokenUsage | None
    content_type: str = "application/json"
    headers: dict[str, str] | None = None
    # The answer as an object, where the translator has it anyway (a Response: what the
    # conversation store keeps); None elsewhere.
    answer: dict[str, Any] | None = None
    # ``body`` is ``orjson.dumps(answer)`` exactly, ``output`` then ``usage`` its last keys (the
    # bridge's Response): the store's record is cut from it (gateway.conversations.records.encode).
    dumped: bool = False
    # Where in a ``dumped`` body its ``,"output":`` starts, where its writer noted it (the bridge's
    # Response written around its echo; 0: not noted): the record's output line is cut there (encode's
    # ``output_at``), the body not searched.
    output_at: int = 0


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
    # The upstream's usage object as read (details included), where the stream read its usage chunk
    # for a consumer that is not a client (the Responses bridge: BridgeChatCall) instead of yielding it.
    usage_fields: Any = None
    # True once the upstream finished cleanly: the next ``__anext__`` will stop. Lets the
    # consumer send the last chunk, ``[DONE]`` and the end of the body in one write.
    finished: bool = False
    # Events yielded so far, for a stream that counts them as it cuts them (the OpenAI-shaped
    # relays); None: the consumer counts the ``data:`` events itself.
    relayed_events: int | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    @abstractmethod
    async def __anext__(self) -> bytes: ...

    @abstractmethod
    async def aclose(self) -> None: ...
