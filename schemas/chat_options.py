"""The small option objects of a Chat Completions request (``stream_options``, ``audio``,
``prediction``, ``web_search_options``, vLLM's ``structured_outputs``), apart from the request
itself (:mod:`schemas.chat`) so each module reads in one sitting.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from schemas.chat_messages import TextPart
from schemas.common import GuidedChoice, JsonObject, NonEmpty
from schemas.errors import FieldRuleError

__all__ = [
    "ApproximateLocation",
    "AudioOutput",
    "ChatStreamOptions",
    "ChatStructuredOutputs",
    "Prediction",
    "UserLocation",
    "WebSearchOptions",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ChatStreamOptions(_Strict):
    include_usage: StrictBool | None = None
    include_obfuscation: StrictBool | None = None
    # vLLM extra: a usage object on every chunk.
    continuous_usage_stats: StrictBool | None = None


class AudioOutput(_Strict):
    voice: NonEmpty  # a built-in voice name (OpenAI adds new ones; not enumerated here)
    format: Literal["wav", "aac", "mp3", "flac", "opus", "pcm16"]


class Prediction(_Strict):
    type: Literal["content"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]


class ApproximateLocation(_Strict):
    city: str | None = None
    country: str | None = None
    region: str | None = None
    timezone: str | None = None


class UserLocation(_Strict):
    type: Literal["approximate"]
    approximate: ApproximateLocation


class WebSearchOptions(_Strict):
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: UserLocation | None = None


class ChatStructuredOutputs(_Strict):
    """vLLM's ``structured_outputs`` (0.11+): exactly one constraint, plus its options."""

    json_: str | JsonObject | None = Field(default=None, alias="json")
    regex: NonEmpty | None = None
    choice: GuidedChoice | None = None
    grammar: NonEmpty | None = None
    json_object: StrictBool | None = None
    structural_tag: NonEmpty | None = None
    disable_fallback: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None
    disable_additional_properties: StrictBool | None = None
    whitespace_pattern: str | None = None

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def check_one_constraint(self) -> ChatStructuredOutputs:
        kinds = ("json_", "regex", "choice", "grammar", "json_object", "structural_tag")
        set_kinds = [k.rstrip("_") for k in kinds if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise FieldRuleError(
                "structured_outputs",
                f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object, structural_tag; "
                f"got {', '.join(set_kinds) or 'none'}",
            )
        return self
