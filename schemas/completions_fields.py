"""Which Completions request fields are vLLM's own, and the values that ask for nothing.

Read by the capability tables (``backends.capabilities`` and each family's): a field set to its
neutral value is no capability violation, and vLLM's extras are refused by name where a backend
type lacks them.
"""

from __future__ import annotations

from typing import Any

from schemas.chat_messages import TextResponseFormat
from schemas.vllm_extras import VLLM_EXTRAS_NEUTRAL

__all__ = ["NESTED_FIELDS", "NEUTRAL_VALUES", "VLLM_EXTRA_FIELDS"]

# Values of the vLLM extras that mean "off": a field explicitly set to one of these
# is not a capability violation on a backend that lacks the feature.
NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "top_k": (-1, 0),
    "min_p": (0.0,),
    "use_beam_search": (False,),
    "length_penalty": (1.0,),
    "repetition_penalty": (1.0,),
    "early_stopping": (False,),
    "stream_options.continuous_usage_stats": (False,),
    "return_tokens_as_token_ids": (False,),
    "return_token_ids": (False,),
    "stop_token_ids": ([],),
    "include_stop_str_in_output": (False,),
    "ignore_eos": (False,),
    "min_tokens": (0,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "add_special_tokens": (True,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logit_bias": ({},),
    "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,),
    "n": (1,),
    "response_format": (TextResponseFormat(type="text"),),
    **VLLM_EXTRAS_NEUTRAL,
}

# Fields inside an object field that a backend may honour or not on their own; capability
# tables name them ``parent.child`` (and so do the errors refusing them).
NESTED_FIELDS: tuple[str, ...] = ("stream_options.continuous_usage_stats",)

VLLM_EXTRA_FIELDS: frozenset[str] = frozenset(
    {
        "top_k",
        "min_p",
        "use_beam_search",
        "length_penalty",
        "repetition_penalty",
        "early_stopping",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "add_special_tokens",
        "truncate_prompt_tokens",
        "truncation_side",
        "allowed_token_ids",
        "prompt_logprobs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "structured_outputs",
        "stream_options.continuous_usage_stats",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "bad_words",
        "logprob_token_ids",
        "thinking_token_budget",
        "watermarking",
        "priority",
        "request_id",
        "session_id",
        "routed_experts_prompt_start",
        "cache_salt",
        "kv_transfer_params",
        "ec_transfer_params",
        "vllm_xargs",
        "repetition_detection",
        "stream_interval",
        # OpenAI's completions has neither (response_format is chat's; vLLM's completions takes it too).
        "response_format",
        "prompt_embeds",
    }
)
