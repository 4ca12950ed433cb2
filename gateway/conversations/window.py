"""Fitting a conversation into a model's context window (Responses' ``truncation``).

The gateway cannot tokenize, so sizes are estimates: the JSON of the items at ~4 characters a
token (``schemas.common.CHARS_PER_TOKEN``; JSON keys and quotes make it err on the large side).
``context`` is the window in tokens (vLLM's ``max_model_len``, or ``routes[].context_length``),
None when unknown: then nothing is dropped or refused here and the upstream has the last word.

- ``auto``: the oldest earlier turns are dropped, whole, until the rest, the new input and the
  output limit fit; when the new input alone does not fit, a 400 naming ``input``.
- ``disabled`` (OpenAI's default): a 400 naming ``input`` when it would not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import orjson

from schemas.common import CHARS_PER_TOKEN
from schemas.errors import InvalidRequestError

__all__ = ["estimate_tokens", "fit"]

T = TypeVar("T", bound=Sequence[Any])


def estimate_tokens(items: Sequence[Any]) -> int:
    """Estimated tokens of ``items`` (any JSON values)."""
    return len(orjson.dumps(items)) // CHARS_PER_TOKEN + 1


def fit(
    turns: Sequence[T],
    new_tokens: int,
    *,
    context: int | None,
    output_tokens: int,
    truncation: Literal["auto", "disabled"] | None,
) -> Sequence[T]:
    """The earlier ``turns`` (each a turn's items, oldest first) to send before a new input of
    ``new_tokens`` (instructions and tools included) with ``output_tokens`` reserved for the answer:
    all of them, or with ``auto`` the newest that fit; a 400 naming ``input`` otherwise."""
    if context is None:
        return turns
    budget = context - output_tokens - new_tokens
    sizes = [estimate_tokens(turn) for turn in turns]
    total = sum(sizes)
    if total <= budget:
        return turns
    if truncation == "auto" and budget > 0:
        dropped = 0
        while total > budget:
            total -= sizes[dropped]
            dropped += 1
        return turns[dropped:]
    need = (total if truncation != "auto" else 0) + new_tokens + output_tokens
    advice = (
        "Set truncation to 'auto' to drop the oldest turns of the conversation, or shorten the input."
        if truncation != "auto"
        else "Shorten the input or lower max_output_tokens."
    )
    raise InvalidRequestError(
        f"The conversation and input are about {need} tokens with the output limit (estimated at "
        f"~{CHARS_PER_TOKEN} characters a token), over the model's context window of {context} tokens. {advice}",
        param="input",
        code="context_length_exceeded",
    )
