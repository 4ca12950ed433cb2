"""The Completions API wire models: the request (with every rule) and the response shapes.

Fields are listed in OpenAI's documented order, then the vLLM extras named in the
seed API. Bounds live in ``Field``; rules that tie fields together are named
``model_validator``s that raise :class:`~schemas.errors.FieldRuleError` naming the
offending field. Validation is strict (no ``"5"`` for an int, no ``0`` for a bool)
and unknown fields are refused by name (``extra="forbid"``).

``null`` means "the default" for every nullable field, as in OpenAI's spec: the
gateway never forwards a ``null`` upstream (see :meth:`CompletionRequest.upstream_fields`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from schemas.common import (
    CHARS_PER_TOKEN,
    GUIDED_FIELDS,
    INT64_MAX,
    ChoiceCount,
    Count,
    CountOrMinusOne,
    FieldRules,
    GuidedChoice,
    Int64,
    JsonObject,
    LogitBias,
    NonEmpty,
    Penalty,
    PositiveFloat,
    Stop,
    Temperature,
    TokenId,
    UnitInterval,
    check_guides,
    check_logit_bias_keys,
    check_stream_options,
)
from schemas.errors import FieldRuleError
from schemas.vllm_extras import (
    VLLM_EXTRAS_NEUTRAL,
    BadWords,
    CacheSalt,
    LogprobTokenIds,
    RepetitionDetection,
    StreamInterval,
    ThinkingTokenBudget,
    TransferParams,
    VLLMXargs,
    check_logprob_token_ids,
    check_routed_experts,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_TOKENS",
    "INT64_MAX",
    "NESTED_FIELDS",
    "NEUTRAL_VALUES",
    "VLLM_EXTRA_FIELDS",
    "Choice",
    "CompletionChunk",
    "CompletionRequest",
    "CompletionResponse",
    "Logprobs",
    "Prompt",
    "StreamOptions",
    "StructuredOutputs",
    "Usage",
]

DEFAULT_MAX_TOKENS = 16

# The four prompt forms: text, a batch of texts, token ids, a batch of token-id lists.
Prompt = (
    str
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


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


class CompletionRequest(BaseModel):
    """``POST /v1/completions``: OpenAI's fields, then vLLM's sampling extras."""

    # allow_inf_nan=False: JSON ``NaN``/``Infinity`` would pass unbounded floats (length_penalty)
    # and one-sided ones (repetition_penalty) and then not serialize as valid JSON upstream.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    # --- OpenAI ---------------------------------------------------------------
    model: NonEmpty
    # Required but nullable (OpenAI): ``null`` is the default, "the start of a document",
    # carried as ``""``; backends that cannot generate from no text refuse it by name.
    prompt: Prompt
    best_of: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    echo: StrictBool | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    # OpenAI's maximum is 5, vLLM's is the server's --max-logprobs: the capability table decides.
    logprobs: Count | None = None
    max_tokens: Count | None = None
    n: ChoiceCount | None = None
    presence_penalty: Penalty | None = None
    seed: Int64 | None = None
    stop: Stop | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: Temperature | None = None
    top_p: UnitInterval | None = None
    user: str | None = None

    # --- vLLM sampling extras (seed API) ---------------------------------------
    top_k: CountOrMinusOne | None = None
    min_p: UnitInterval | None = None
    use_beam_search: StrictBool | None = None
    length_penalty: float | None = None
    repetition_penalty: PositiveFloat | None = None
    # vLLM (and Hugging Face) accept True, False or "never"; the capability table decides.
    early_stopping: StrictBool | Literal["never"] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: StrictBool | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: Count | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    add_special_tokens: StrictBool | None = None
    truncate_prompt_tokens: CountOrMinusOne | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    # -1: every token of the vocabulary (>= 0.11); bounded per backend like logprobs.
    prompt_logprobs: CountOrMinusOne | None = None
    return_tokens_as_token_ids: StrictBool | None = None
    return_token_ids: StrictBool | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | JsonObject | None = None
    guided_regex: NonEmpty | None = None
    guided_choice: GuidedChoice | None = None
    guided_grammar: NonEmpty | None = None
    guided_decoding_backend: NonEmpty | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's own fields that chat takes too (schemas.vllm_extras: one definition for both).
    bad_words: BadWords | None = None
    logprob_token_ids: LogprobTokenIds | None = None  # with logprobs: these tokens' logprobs, not the top ones
    thinking_token_budget: ThinkingTokenBudget | None = None
    watermarking: StrictBool | None = None  # false opts out of a server's default watermark
    priority: Int64 | None = None  # lower is earlier; non-zero needs the server's priority scheduling
    request_id: NonEmpty | None = None
    session_id: NonEmpty | None = None
    # The first prompt tokens left out of each choice's routed_experts (kept in the answer when set).
    routed_experts_prompt_start: Count | None = None
    cache_salt: CacheSalt | None = None
    kv_transfer_params: TransferParams | None = None  # disaggregated prefill/decode
    ec_transfer_params: TransferParams | None = None  # disaggregated encoder cache
    vllm_xargs: VLLMXargs | None = None
    repetition_detection: RepetitionDetection | None = None
    stream_interval: StreamInterval | None = None

    # --- single-field rules ------------------------------------------------------
    @field_validator("prompt", mode="before")
    @classmethod
    def null_prompt_is_the_default(cls, value: Any) -> Any:
        # OpenAI: "prompt" is required and nullable; null generates from the start of a document.
        return "" if value is None else value

    # --- cross-field rules ------------------------------------------------------
    @model_validator(mode="after")
    def check_rules(self) -> CompletionRequest:
        """The cross-field rules, in this order (the first one broken is the error).

        One validator, not one per rule: a rule runs only when a field that can break it
        was set (an unset field is its default, ``None``, which breaks no rule), so a plain
        request (model, prompt, a few sampling fields) pays for one set intersection.
        """
        _RULES.run(self, self.__pydantic_fields_set__)
        return self

    def _check_logit_bias_keys(self) -> None:
        check_logit_bias_keys(self.logit_bias)

    def _check_best_of(self) -> None:
        if self.best_of is None:
            return
        n = self.n or 1
        if self.best_of < n:
            raise FieldRuleError("best_of", f"best_of ({self.best_of}) must be greater than or equal to n ({n})")
        if self.stream and self.best_of != n:
            raise FieldRuleError("best_of", "best_of cannot be used with stream (results cannot be streamed)")

    def _check_stream_options(self) -> None:
        check_stream_options(self.stream_options, self.stream)

    def _check_min_tokens(self) -> None:
        if self.min_tokens:
            max_tokens = DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
            if self.min_tokens > max_tokens:
                raise FieldRuleError(
                    "min_tokens",
                    f"min_tokens ({self.min_tokens}) must be less than or equal to max_tokens ({max_tokens})",
                )

    def _check_structured_outputs(self) -> None:
        structured = self.structured_outputs
        if structured is None:
            return
        kinds = structured.constraints()
        if len(kinds) > 1:
            raise FieldRuleError(
                "structured_outputs", f"only one structured-output constraint may be set; got {', '.join(kinds)}"
            )
        guides = [name for name in GUIDED_FIELDS if getattr(self, name) is not None]
        if guides:
            raise FieldRuleError(
                "structured_outputs", f"structured_outputs and {guides[0]} are two forms of one constraint; send one"
            )

    def _check_prompt_logprobs(self) -> None:
        if self.prompt_logprobs is not None and self.stream:
            raise FieldRuleError("prompt_logprobs", "prompt_logprobs is not available with stream")

    def _check_logprob_token_ids(self) -> None:
        check_logprob_token_ids(self.logprob_token_ids, self.logprobs is not None, self.use_beam_search)

    def _check_routed_experts(self) -> None:
        check_routed_experts(self.routed_experts_prompt_start, self.stream)

    def _check_guided_count(self) -> None:
        check_guides(
            [name for name in GUIDED_FIELDS if getattr(self, name) is not None],
            guided_json=self.guided_json,
            whitespace_pattern=self.guided_whitespace_pattern,
            decoding_backend=self.guided_decoding_backend,
        )

    def _check_beam_search(self) -> None:
        if self.use_beam_search and self.stream:
            raise FieldRuleError("use_beam_search", "use_beam_search cannot be used with stream")

    # --- helpers for the request path --------------------------------------------
    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set to a non-null value, as plain JSON-able data.

        This is what an OpenAI-shaped upstream receives (after the adapter maps
        ``model``); unset and ``null`` fields fall back to the upstream's defaults.
        """
        return self.model_dump(exclude_none=True, exclude_unset=True, by_alias=True)

    @property
    def effective_n(self) -> int:
        return self.n or 1

    @property
    def prompt_count(self) -> int:
        """How many prompts the request carries (a batch multiplies the choices)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return 1
        return len(prompt)

    # --- the request path's common interface (gateway.served.ServedRequest) ---------------
    output_limit_param: ClassVar[str] = "max_tokens"
    output_bounded: ClassVar[bool] = True  # unset, max_tokens is 16

    @property
    def output_limit_set(self) -> bool:
        return self.max_tokens is not None

    @property
    def output_limit(self) -> int:
        """Tokens each choice may generate: ``max_tokens``, or OpenAI's default of 16."""
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def prompt_array(self) -> list[Any] | None:
        """The prompt when it is an array (of texts, token ids or token-id arrays)."""
        return self.prompt if type(self.prompt) is list else None

    @property
    def sequences(self) -> int:
        """Sequences generated per prompt: ``max(n, best_of)``."""
        n, best_of = self.n or 1, self.best_of or 1
        return n if n > best_of else best_of

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def prompt_estimate(self) -> int:
        """A cheap upper-ish estimate of the prompt's tokens: exact for token ids, ~4 characters a token for text."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return len(prompt) // CHARS_PER_TOKEN + 1
        if not prompt:
            return 0
        first = prompt[0]
        if isinstance(first, int):
            return len(prompt)
        if isinstance(first, str):
            return sum(len(p) // CHARS_PER_TOKEN + 1 for p in prompt if isinstance(p, str))
        return sum(len(p) for p in prompt if isinstance(p, list))

    def routing_text(self) -> str | list[int]:
        """The leading part of the (first) prompt, for prefix routing."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        first = prompt[0] if prompt else ""
        if isinstance(first, str | list):
            return first
        return [t for t in prompt if isinstance(t, int)]


# check_rules' table: (the fields whose setting can break the rule, the rule), in the order the
# rules are checked. Each rule raises only when one of its fields holds a non-default value.
_RULES: FieldRules[CompletionRequest] = FieldRules(
    (frozenset({"logit_bias"}), CompletionRequest._check_logit_bias_keys),
    (frozenset({"best_of"}), CompletionRequest._check_best_of),
    (frozenset({"stream_options"}), CompletionRequest._check_stream_options),
    (frozenset({"min_tokens"}), CompletionRequest._check_min_tokens),
    (frozenset({"structured_outputs"}), CompletionRequest._check_structured_outputs),
    (frozenset({"prompt_logprobs"}), CompletionRequest._check_prompt_logprobs),
    (frozenset({"logprob_token_ids"}), CompletionRequest._check_logprob_token_ids),
    (frozenset({"routed_experts_prompt_start"}), CompletionRequest._check_routed_experts),
    (
        frozenset({*GUIDED_FIELDS, "guided_whitespace_pattern", "guided_decoding_backend"}),
        CompletionRequest._check_guided_count,
    ),
    (frozenset({"use_beam_search"}), CompletionRequest._check_beam_search),
)


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
    }
)


# --- response shapes (used by the mock backend, OpenAPI and tests; the relay path
# --- does not re-validate upstream bodies) ------------------------------------------


class Logprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class Choice(BaseModel):
    text: str
    index: int
    logprobs: Logprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[Choice]
    system_fingerprint: str | None = None
    usage: Usage | None = None


class CompletionChunk(CompletionResponse):
    """A streamed chunk: the same shape, ``usage`` null except on the final usage chunk."""
