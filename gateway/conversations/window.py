"""Fitting a conversation into a model's context window (``truncation``).

The gateway cannot tokenize, so sizes are estimates: the JSON of the items at ~4 characters a
token (``schemas.common.CHARS_PER_TOKEN``; JSON keys and quotes make it err on the large side).
``context`` is the route's window in tokens (vLLM's ``max_model_len``), None when unknown: then
nothing is dropped or refused here and the upstream has the last word.

- ``auto``: the oldest earlier turns are dropped, whole, until the rest, the new input and the
  output limit fit; when the new input alone does not fit, a 400 naming ``input``.
- ``disabled`` (OpenAI's default): a 400 naming ``input`` when it would not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson

from gateway.conversations.store import Conversation
from schemas.common import CHARS_PER_TOKEN
from schemas.errors import InvalidRequestError

__all__ = ["estimate_tokens", "fit"]


def estimate_tokens(items: Sequence[Any]) -> int:
    """Estimated tokens of ``items`` (or any JSON value list)."""
    return len(orjson.dumps(items)) // CHARS_PER_TOKEN + 1


def fit(
    conversation: Conversation,
    new_tokens: int,
    *,
    context: int | None,
    output_tokens: int,
    truncation: Literal["auto", "disabled"] | None,
) -> Conversation:
    """The turns of ``conversation`` to send before a new input of ``new_tokens`` (instructions and
    tools included) with ``output_tokens`` reserved for the answer (1 when unbounded)."""
    if context is None:
        return conversation
    budget = context - output_tokens - new_tokens
    sizes = [estimate_tokens(turn.items) for turn in conversation.turns]
    total = sum(sizes)
    if total <= budget:
        return conversation
    if truncation == "auto" and budget > 0:
        dropped = 0
        while total > budget:
            total -= sizes[dropped]
            dropped += 1
        return Conversation(conversation.turns[dropped:])
    need = total + new_tokens + output_tokens if truncation != "auto" else new_tokens + output_tokens
    raise InvalidRequestError(
        f"The input is about {need} tokens with the output limit (estimated at ~{CHARS_PER_TOKEN} characters a "
        f"token), over the model's context window of {context} tokens. "
        + (
            "Set truncation to 'auto' to drop the oldest turns of the conversation, or shorten the input."
            if truncation != "auto"
            else "Shorten the input or lower the output limit."
        ),
        param="input",
        code="context_length_exceeded",
    )
