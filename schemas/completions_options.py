"""The value types of a Completions request's composite fields: ``prompt``, ``stream_options``,
vLLM's ``structured_outputs``, ``response_format`` and ``prompt_embeds``, apart from the request
itself (:mod:`schemas.completions`) so each module reads in one sitting.

``response_format`` takes the forms vLLM's ``/v1/completions`` applies (0.32): chat's ``text``,
``json_object`` and ``json_schema`` (:mod:`schemas.chat_messages`), and ``structural_tag``
(xgrammar's ``format`` object, or the older ``structures`` + ``triggers``). ``prompt_embeds`` is
what vLLM decodes: base64 of a ``torch.save``d tensor, one per prompt (a string or a list).
"""

from __future__ import annotations

import binascii
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, model_validator

from schemas.chat_messages import JSONObjectResponseFormat, JSONSchemaResponseFormat, TextResponseFormat
from schemas.common import GuidedChoice, JsonObject, NonEmpty, TokenId
from schemas.errors import FieldRuleError

__all__ = [
    "CompletionResponseFormat",
    "Prompt",
    "PromptEmbeds",
    "StreamOptions",
    "StructuralTag",
    "StructuralTagResponseFormat",
    "StructuredOutputs",
    "embeds_bytes",
]

# The four prompt forms: text, a batch of texts, token ids, a batch of token-id lists.
Prompt = (
    str
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool | None = None
    # vLLM extra: a usage object on every chunk.
    continuous_usage_stats: bool | None = None


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` (``StructuredOutputsParams``, >= 0.11; the only form from 0.12)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # ``json`` on the wire (a BaseModel attribute name in Python).
    json_: str | JsonObject | None = Field(None, alias="json")
    regex: NonEmpty | None = None
    choice: GuidedChoice | None = None
    grammar: NonEmpty | None = None
    json_object: StrictBool | None = None
    disable_fallback: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None
    disable_additional_properties: StrictBool | None = None
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def constraints(self) -> list[str]:
        """The constraint kinds set (vLLM allows one: json, regex, choice, grammar or json_object)."""
        return [
            wire
            for wire, value in (
                ("json", self.json_),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
                ("json_object", self.json_object or None),
            )
            if value is not None
        ]


# --- response_format ----------------------------------------------------------------------------


class StructuralTag(_Strict):
    """One structure of the older ``structural_tag`` form: text between ``begin`` and ``end`` follows ``schema``."""

    begin: NonEmpty
    schema_: JsonObject | None = Field(default=None, alias="schema")
    end: str

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False, populate_by_name=True)


class StructuralTagResponseFormat(_Strict):
    """vLLM's ``{"type": "structural_tag"}``: xgrammar's ``format`` object, or ``structures`` with ``triggers``."""

    type: Literal["structural_tag"]
    format: JsonObject | None = None
    structures: Annotated[list[StructuralTag], Field(min_length=1)] | None = None
    triggers: Annotated[list[NonEmpty], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def check_one_form(self) -> StructuralTagResponseFormat:
        legacy = (self.structures is not None, self.triggers is not None)
        if legacy not in ((False, False), (True, True)) or (self.format is None) == (legacy == (False, False)):
            raise FieldRuleError(
                "response_format", "a structural_tag response_format takes either format, or structures and triggers"
            )
        return self


CompletionResponseFormat = Annotated[
    TextResponseFormat | JSONObjectResponseFormat | JSONSchemaResponseFormat | StructuralTagResponseFormat,
    Field(discriminator="type"),
]


# --- prompt_embeds ------------------------------------------------------------------------------


def _base64(value: str) -> str:
    try:
        binascii.a2b_base64(value, strict_mode=True)  # vLLM decodes with validate=True: the same alphabet
    except binascii.Error:
        raise ValueError("each prompt_embeds item must be base64 (a torch.save'd tensor)") from None
    return value


# One tensor, (tokens, hidden size) or (1, tokens, hidden size), as base64 of its torch.save bytes.
_Embed = Annotated[str, Field(min_length=4), AfterValidator(_base64)]
PromptEmbeds = _Embed | Annotated[list[_Embed], Field(min_length=1)]


def embeds_bytes(embeds: str | list[str]) -> int:
    """The decoded size of ``prompt_embeds``, in bytes (base64: 3 bytes per 4 characters)."""
    texts = [embeds] if isinstance(embeds, str) else embeds
    return sum(len(text) // 4 * 3 for text in texts)
