"""The Completions API request: its fields and every rule (the answer shapes: :mod:`schemas.completions_responses`).

Fields are listed in OpenAI's documented order, then the vLLM extras named in the seed API.
The composite fields' types live in :mod:`schemas.completions_options`, which fields are
vLLM's (and their "off" values) in :mod:`schemas.completions_fields`. Bounds live in
``Field``; rules that tie fields together are named ``model_validator``s that raise
:class:`~schemas.errors.FieldRuleError` naming the offending field. Validation is strict
(no ``"5"`` for an int, no ``0`` for a bool) and unknown fields are refused by name
(``extra="forbid"``).

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
from schemas.completions_fields import NESTED_FIELDS, NEUTRAL_VALUES, VLLM_EXTRA_FIELDS
from schemas.completions_options import (
    CompletionResponseFormat,
    Prompt,
    PromptEmbeds,
    StreamOptions,
    StructuredOutputs,
    embeds_bytes,
)
from schemas.completions_responses import Choice, CompletionChunk, CompletionResponse, Logprobs, Usage
from schemas.errors import FieldRuleError
from schemas.vllm_extras import (
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
    "CompletionResponseFormat",
    "Logprobs",
    "Prompt",
    "StreamOptions",
    "StructuredOutputs",
    "Usage",
]

DEFAULT_MAX_TOKENS = 16
# A prompt_embeds tensor's bytes per token, for estimates only (hidden size 1024 in float32, 2048 in
# bfloat16): a larger model's rows are larger, so its prompts are over-estimated, a smaller one's under-.
EMBED_BYTES_PER_TOKEN = 4096


def _prompt_or_embeds(schema: dict[str, Any]) -> None:
    """The JSON Schema (OpenAPI) says what the validator does: ``prompt`` is required unless
    ``prompt_embeds`` is there (its Python default only stands for "not sent")."""
    schema["properties"]["prompt"].pop("default", None)
    schema["anyOf"] = [{"required": ["prompt"]}, {"required": ["prompt_embeds"]}]


class CompletionRequest(BaseModel):
    """``POST /v1/completions``: OpenAI's fields, then vLLM's sampling extras."""

    # allow_inf_nan=False: JSON ``NaN``/``Infinity`` would pass unbounded floats (length_penalty)
    # and one-sided ones (repetition_penalty) and then not serialize as valid JSON upstream.
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, allow_inf_nan=False, json_schema_extra=_prompt_or_embeds
    )

    # --- OpenAI ---------------------------------------------------------------
    model: NonEmpty
    # Required but nullable (OpenAI): ``null`` is the default, "the start of a document",
    # carried as ``""``; backends that cannot generate from no text refuse it by name. It may be
    # left out when prompt_embeds is set (vLLM): the default here only stands for "not sent".
    prompt: Prompt = ""
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
    # Chat's output formats plus vLLM's structural_tag; one output constraint at a time.
    response_format: CompletionResponseFormat | None = None
    # One prompt per tensor, before prompt's own (vLLM needs --enable-prompt-embeds); not with echo,
    # suffix or prompt_logprobs, which vLLM refuses for them.
    prompt_embeds: PromptEmbeds | None = None
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
        fields_set = self.__pydantic_fields_set__
        if "prompt" not in fields_set and self.prompt_embeds is None:
            raise FieldRuleError("prompt", "Missing required parameter: 'prompt'.")
        _RULES.run(self, fields_set)
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

    def _check_response_format(self) -> None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return  # plain text constrains nothing
        structured = self.structured_outputs
        others = [name for name in GUIDED_FIELDS if getattr(self, name) is not None]
        if structured is not None and structured.constraints():
            others.append("structured_outputs")
        if others:
            raise FieldRuleError(
                "response_format", f"response_format and {others[0]} are two output constraints; send one"
            )

    def _check_prompt_embeds(self) -> None:
        if self.prompt_embeds is None:
            return
        # vLLM refuses these with prompt embeddings: there is no prompt text to echo, complete or score.
        for name, value in (
            ("echo", self.echo or None),
            ("suffix", self.suffix),
            ("prompt_logprobs", self.prompt_logprobs),
        ):
            if value is not None:
                raise FieldRuleError(name, f"{name} is not available with prompt_embeds")

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
        ``model``); unset and ``null`` fields fall back to the upstream's defaults. With
        ``prompt_embeds``, an empty ``prompt`` (or ``null``) is left out: no prompt of its own.
        """
        fields = self.model_dump(exclude_none=True, exclude_unset=True, by_alias=True)
        if self.prompt_embeds is not None and self.prompt == "":
            fields.pop("prompt", None)
        return fields

    @property
    def effective_n(self) -> int:
        return self.n or 1

    @property
    def prompt_count(self) -> int:
        """How many prompts the request carries (a batch multiplies the choices); each of
        ``prompt_embeds`` is one more, before the text ones (a prompt left out counts none)."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            count = 1
        else:
            count = len(prompt)
        embeds = self.prompt_embeds
        if embeds is None:
            return count
        if prompt == "":  # vLLM's "either": empty text next to embeddings is no prompt of its own
            count = 0
        return count + (1 if isinstance(embeds, str) else len(embeds))

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
        """A cheap upper-ish estimate of the prompt's tokens: exact for token ids, ~4 characters a token for
        text, :data:`EMBED_BYTES_PER_TOKEN` tensor bytes a token for ``prompt_embeds``."""
        prompt = self.prompt
        # The embeddings' share; an attribute read on the plain path (no call).
        extra = 0 if self.prompt_embeds is None else embeds_bytes(self.prompt_embeds) // EMBED_BYTES_PER_TOKEN + 1
        if isinstance(prompt, str):
            return extra + len(prompt) // CHARS_PER_TOKEN + 1
        if not prompt:
            return extra
        first = prompt[0]
        if isinstance(first, int):
            return extra + len(prompt)
        if isinstance(first, str):
            return extra + sum(len(p) // CHARS_PER_TOKEN + 1 for p in prompt if isinstance(p, str))
        return extra + sum(len(p) for p in prompt if isinstance(p, list))

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
    (frozenset({"response_format"}), CompletionRequest._check_response_format),
    (frozenset({"prompt_embeds"}), CompletionRequest._check_prompt_embeds),
)
