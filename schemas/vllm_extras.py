"""vLLM's own request fields that both generation endpoints take (``/v1/completions`` and
``/v1/chat/completions``): one definition of each field's bounds and rules, used by
:mod:`schemas.completions` and :mod:`schemas.chat`.

Bounds follow vLLM 0.32's request models (``cache_salt`` 1..1024 characters; 0.32's tighter bound
on it is per version: ``backends.vllm.capabilities``; ``stream_interval``
>= 1, ``routed_experts_prompt_start`` >= 0, ``vllm_xargs`` values that survive JSON exactly);
the rules that tie a field to another raise :class:`~schemas.errors.FieldRuleError` naming it.
Which servers honour them is the backends' business (``backends.vllm.versions``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, model_validator

from schemas.common import INT64_MAX, Count, CountOrMinusOne, Int64, JsonObject, NonEmpty, TokenId
from schemas.errors import FieldRuleError

__all__ = [
    "VLLM_EXTRAS_NEUTRAL",
    "BadWords",
    "CacheSalt",
    "LogprobTokenIds",
    "RepetitionDetection",
    "StreamInterval",
    "ThinkingTokenBudget",
    "TransferParams",
    "VLLMXargs",
    "check_logprob_token_ids",
    "check_routed_experts",
]


def _no_int(value: Any) -> Any:
    if isinstance(value, int):  # a float field takes an int as a float: 2**63 would lose its value
        raise ValueError("an integer here must fit in 64 bits")
    return value


# ``vllm_xargs`` values: strings, int64 integers, finite floats, or lists of those.
_XargScalar = str | Int64 | Annotated[float, BeforeValidator(_no_int)]
VLLMXargs = dict[str, _XargScalar | list[_XargScalar]]

BadWords = list[NonEmpty]
# Logprobs of these tokens at each position (logprobs asked for), instead of the top ones.
LogprobTokenIds = Annotated[list[TokenId], Field(min_length=1)]
ThinkingTokenBudget = CountOrMinusOne  # -1: unlimited; needs the server's reasoning config
CacheSalt = Annotated[str, Field(min_length=1, max_length=1024)]  # salts the server's prefix cache
TransferParams = JsonObject  # disaggregated serving (kv_/ec_transfer_params); the answer's come back
StreamInterval = Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]  # tokens per streamed chunk


class RepetitionDetection(BaseModel):
    """vLLM's ``repetition_detection`` (0.18+): end the text when an n-gram repeats ``min_count`` times."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    max_pattern_size: Count | None = None
    min_pattern_size: Count | None = None
    min_count: Count | None = None

    @model_validator(mode="after")
    def check_sizes(self) -> RepetitionDetection:
        largest, smallest = self.max_pattern_size or 0, self.min_pattern_size or 0
        if smallest > largest:
            raise FieldRuleError(
                "repetition_detection", "repetition_detection.min_pattern_size must be <= max_pattern_size"
            )
        if largest > 0 and (self.min_count or 0) < 2:
            raise FieldRuleError(
                "repetition_detection", "repetition_detection.min_count must be >= 2 when max_pattern_size is set"
            )
        return self


def check_logprob_token_ids(ids: list[int] | None, logprobs_asked: bool, beam_search: bool | None) -> None:
    """vLLM's rule: ``logprob_token_ids`` needs logprobs asked for, and no beam search."""
    if ids is None:
        return
    if not logprobs_asked:
        raise FieldRuleError("logprob_token_ids", "logprob_token_ids requires logprobs to be set")
    if beam_search:
        raise FieldRuleError("logprob_token_ids", "logprob_token_ids is not available with use_beam_search")


def check_routed_experts(start: int | None, stream: bool | None) -> None:
    """``routed_experts_prompt_start`` asks for each choice's ``routed_experts``, which vLLM never streams."""
    if start is not None and stream:
        raise FieldRuleError("routed_experts_prompt_start", "routed_experts_prompt_start is not available with stream")


# The values of these fields that ask for nothing: set to one of them, a field is no capability violation.
VLLM_EXTRAS_NEUTRAL: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "bad_words": ([],),
        "vllm_xargs": ({},),
        "watermarking": (False,),
        "routed_experts_prompt_start": (0,),
        "priority": (0,),
    }
)
