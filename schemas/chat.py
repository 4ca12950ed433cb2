"""The Chat Completions API request: every field with its bounds, and the rules that tie them.

Fields are listed in OpenAI's documented order (``CreateChatCompletionRequest``), then
vLLM's chat extras (spec chat-protocol.md sections 1-2). Bounds live in ``Field``; rules
that tie fields together are named ``model_validator``s that raise
:class:`~schemas.errors.FieldRuleError` naming the offending field. Validation is strict
(no ``"5"`` for an int, no ``1`` for a bool), unknown fields are refused by name, and every
integer is bounded to int64 so that re-serialising a request for an upstream never fails.

``null`` means "the default" for every optional field: :meth:`ChatCompletionRequest.upstream_fields`
never forwards one. Messages, tools and formats live in :mod:`schemas.chat_messages`; what the
request path reads of a request beyond its fields (its output limit, prompt estimate, routing text)
in :mod:`schemas.chat_served`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from schemas.chat_messages import (
    AllowedToolsChoice,
    AssistantMessage,
    ChatMessage,
    FunctionDefinition,
    FunctionTool,
    NamedCustomChoice,
    NamedFunctionChoice,
    ResponseFormat,
    Tool,
    ToolChoice,
    message_upstream_fields,
)
from schemas.chat_messages import FunctionCallChoice as FunctionCallChoice
from schemas.chat_options import (
    AudioOutput,
    ChatStreamOptions,
    ChatStructuredOutputs,
    Prediction,
    WebSearchOptions,
)
from schemas.chat_served import ChatServed
from schemas.common import (
    GUIDED_FIELDS,
    ChoiceCount,
    Count,
    CountOrMinusOne,
    FieldDumps,
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
    "MAX_TOP_LOGPROBS",
    "TOOLS_NOTE",
    "ChatCompletionRequest",
    "ChatStreamOptions",
    "ChatStructuredOutputs",
    "StructuredOutputs",
]

MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128  # OpenAI's limit on tools (and deprecated functions) per request
# A request's tools as the code that built them recorded their upstream form, in its private slot:
# ``((tool, kind, spec), ...)``, one per tool in order, ``tool`` the model, ``spec`` what the field's
# serializer makes of ``tool.<kind>`` (set, non-null fields in declared order; nested values the
# tool's own, so equal). The chat bridge records it as it builds a translation
# (backends.responses.chat_tools): :meth:`ChatCompletionRequest.upstream_fields` then copies the
# specs rather than serializing every tool's JSON Schema again. Read only while each tool is still
# the one recorded (a copy with other tools is serialized).
TOOLS_NOTE = "chat_upstream_tools"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# Named apart from schemas.completions.StructuredOutputs so the OpenAPI components keep both short names.
StructuredOutputs = ChatStructuredOutputs


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class ChatCompletionRequest(ChatServed, _Strict):
    """``POST /v1/chat/completions``: OpenAI's fields, then vLLM's chat extras."""

    # --- OpenAI (documented order) ---------------------------------------------------------
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: NonEmpty
    modalities: Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=2)] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    max_completion_tokens: Count | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    web_search_options: WebSearchOptions | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    audio: AudioOutput | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    stop: Stop | None = None
    logit_bias: LogitBias | None = None
    logprobs: StrictBool | None = None
    max_tokens: Count | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    n: ChoiceCount | None = None
    prediction: Prediction | None = None
    seed: Int64 | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    stream_options: ChatStreamOptions | None = None
    temperature: Temperature | None = None
    top_p: UnitInterval | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    user: str | None = None  # deprecated by OpenAI: safety_identifier and prompt_cache_key
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: str | None = None
    metadata: Metadata | None = None
    functions: Annotated[list[FunctionDefinition], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    function_call: FunctionCallChoice | None = None

    # --- vLLM chat extras -----------------------------------------------------------------
    echo: StrictBool | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    add_special_tokens: StrictBool | None = None
    documents: list[dict[str, str]] | None = None
    chat_template: NonEmpty | None = None
    chat_template_kwargs: JsonObject | None = None
    media_io_kwargs: dict[str, JsonObject] | None = None  # per modality: how vLLM decodes media (video frames, ...)
    mm_processor_kwargs: JsonObject | None = None  # the model's multimodal (HF) processor's keyword arguments
    use_beam_search: StrictBool | None = None  # beam width is n; vLLM streams beams in chat (not completions)
    top_k: CountOrMinusOne | None = None
    min_p: UnitInterval | None = None
    repetition_penalty: PositiveFloat | None = None
    watermarking: StrictBool | None = None  # false opts out of a server's default watermark (vLLM --watermark-*)
    length_penalty: float | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: StrictBool | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: Count | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    truncate_prompt_tokens: CountOrMinusOne | None = None
    truncation_side: Literal["left", "right"] | None = None
    # -1: every token of the vocabulary; bounded per backend (vLLM's --max-logprobs) like logprobs.
    prompt_logprobs: CountOrMinusOne | None = None
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    bad_words: BadWords | None = None
    logprob_token_ids: LogprobTokenIds | None = None
    include_reasoning: StrictBool | None = None  # false: the reasoning text is left out of the answer
    thinking_token_budget: ThinkingTokenBudget | None = None
    guided_json: str | JsonObject | None = None
    guided_regex: NonEmpty | None = None
    guided_choice: GuidedChoice | None = None
    guided_grammar: NonEmpty | None = None
    guided_decoding_backend: NonEmpty | None = None
    guided_whitespace_pattern: str | None = None
    structured_outputs: ChatStructuredOutputs | None = None
    priority: Int64 | None = None
    request_id: NonEmpty | None = None
    return_tokens_as_token_ids: StrictBool | None = None
    return_token_ids: StrictBool | None = None  # prompt_token_ids and each choice's token_ids in the answer
    # The first prompt tokens left out of each choice's routed_experts (servers started with
    # --enable-return-routed-experts); the answer keeps routed_experts for a request that sets it.
    routed_experts_prompt_start: Count | None = None
    session_id: NonEmpty | None = None
    cache_salt: CacheSalt | None = None
    kv_transfer_params: TransferParams | None = None  # disaggregated prefill/decode
    ec_transfer_params: TransferParams | None = None  # disaggregated encoder cache
    vllm_xargs: VLLMXargs | None = None
    repetition_detection: RepetitionDetection | None = None
    stream_interval: StreamInterval | None = None

    # --- cross-field rules ----------------------------------------------------------------------
    @model_validator(mode="after")
    def check_rules(self) -> ChatCompletionRequest:
        """The cross-field rules, in this order (the first one broken is the error).

        One validator, not one per rule: a rule runs only when a field that can break it
        was set (an unset field is its default, which breaks no rule), so a plain request
        (messages and a few sampling fields) pays for the message check alone.
        """
        self._check_messages()
        _RULES.run(self, self.__pydantic_fields_set__)
        return self

    def _check_messages(self) -> None:
        for i, message in enumerate(self.messages):
            if (
                message.role == "assistant"  # an attribute read: most messages stop here, no call
                and isinstance(message, AssistantMessage)
                and message.content is None
                and not (message.tool_calls or message.function_call or message.audio)
            ):
                raise FieldRuleError(
                    "messages",
                    f"messages[{i}]: an assistant message needs content unless it has tool_calls "
                    "(or function_call / audio)",
                )

    def _check_max_tokens_pair(self) -> None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise FieldRuleError(
                "max_tokens",
                "max_tokens and max_completion_tokens cannot both be set; use max_completion_tokens",
            )

    def _check_top_logprobs(self) -> None:
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldRuleError("top_logprobs", "top_logprobs requires logprobs to be true")

    def _check_stream_options(self) -> None:
        check_stream_options(self.stream_options, self.stream)

    def _check_logit_bias_keys(self) -> None:
        check_logit_bias_keys(self.logit_bias)

    def _check_tools(self) -> None:
        names: set[str] = set()
        for tool in self.tools or ():
            name = tool.function.name if isinstance(tool, FunctionTool) else tool.custom.name
            if name in names:  # the first name given twice, in the client's order
                raise FieldRuleError("tools", f"the names in tools must be unique; {name!r} is given twice")
            names.add(name)
        choice = self.tool_choice
        if choice is not None and choice != "none" and not names:
            raise FieldRuleError("tool_choice", "tool_choice is only allowed when tools are specified")
        if self.parallel_tool_calls is not None and not names:
            raise FieldRuleError("parallel_tool_calls", "parallel_tool_calls is only allowed when tools are specified")
        named: list[NamedFunctionChoice | NamedCustomChoice] = []
        if isinstance(choice, NamedFunctionChoice | NamedCustomChoice):
            named = [choice]
        elif isinstance(choice, AllowedToolsChoice):
            named = list(choice.allowed_tools.tools)
        kinds = {(t.type, t.function.name if isinstance(t, FunctionTool) else t.custom.name) for t in self.tools or ()}
        for ref in named:
            name = ref.function.name if isinstance(ref, NamedFunctionChoice) else ref.custom.name
            if (ref.type, name) not in kinds:
                raise FieldRuleError(
                    "tool_choice", f"tool_choice names a {ref.type} tool {name!r} that is not in tools"
                )

    def _check_functions(self) -> None:
        if self.function_call is None or self.function_call == "none":
            return
        names = {f.name for f in self.functions or ()}
        if not names:
            raise FieldRuleError("function_call", "function_call is only allowed when functions are specified")
        if not isinstance(self.function_call, str) and self.function_call.name not in names:
            raise FieldRuleError("function_call", f"function_call names {self.function_call.name!r}, not in functions")

    def _check_audio(self) -> None:
        if self.modalities is not None and "audio" in self.modalities and self.audio is None:
            raise FieldRuleError("audio", "audio (voice and format) is required when modalities include 'audio'")

    def _check_template_flags(self) -> None:
        if not self.continue_final_message:
            return
        if self.add_generation_prompt:
            raise FieldRuleError(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            )
        if not isinstance(self.messages[-1], AssistantMessage):
            raise FieldRuleError(
                "continue_final_message", "continue_final_message needs the last message to be the assistant's"
            )

    def _check_min_tokens(self) -> None:
        limit = self.max_output_tokens
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            raise FieldRuleError(
                "min_tokens", f"min_tokens ({self.min_tokens}) must be less than or equal to max tokens ({limit})"
            )

    def _check_prompt_logprobs(self) -> None:
        # vLLM takes 0 with stream but a stream carries no prompt logprobs: refused rather than dropped.
        if self.prompt_logprobs is not None and self.stream:
            raise FieldRuleError("prompt_logprobs", "prompt_logprobs is not available with stream")

    def _check_routed_experts(self) -> None:
        check_routed_experts(self.routed_experts_prompt_start, self.stream)

    def _check_logprob_token_ids(self) -> None:
        check_logprob_token_ids(self.logprob_token_ids, bool(self.logprobs), self.use_beam_search)

    def _check_one_constraint(self) -> None:
        """One output constraint at a time: guided_*, structured_outputs or a JSON response_format."""
        constraints = [name for name in ("response_format", *GUIDED_FIELDS) if getattr(self, name) is not None]
        if self.response_format is not None and self.response_format.type == "text":
            constraints.remove("response_format")  # plain text constrains nothing
        if self.structured_outputs is not None:
            constraints.append("structured_outputs")
        check_guides(
            constraints,
            guided_json=self.guided_json,
            whitespace_pattern=self.guided_whitespace_pattern,
            decoding_backend=self.guided_decoding_backend,
        )

    # --- helpers for the request path ------------------------------------------------------------
    def upstream_fields(self) -> dict[str, Any]:
        """The fields the client set to a non-null value, as plain JSON-able data (wire names).

        Exactly ``model_dump(exclude_none=True, exclude_unset=True, by_alias=True)``, keys in
        declared order, but built from the set fields alone: the model's serializer walks all
        of its ~60 declared fields on every call (issue 14). A plain value (str, int, float,
        bool) is immutable and dumps as itself; anything else goes through its field's own
        serializer, which copies it (callers edit the result) and drops nested nulls; tools whose
        upstream form their builder recorded (:data:`TOOLS_NOTE`) are copied from the record.
        """
        values = self.__dict__
        out: dict[str, Any] = {}
        for name in sorted(self.__pydantic_fields_set__, key=_FIELDS.order.__getitem__):
            value = values[name]
            if value is None:
                continue
            if type(value) in _PLAIN:
                out[name] = value
            elif name == "messages":
                out[name] = [message_upstream_fields(message) for message in value]
            elif type(value) is ChatStreamOptions:  # flags only: its serializer's result, without its call
                out[name] = {key: flag for key, flag in value.__dict__.items() if flag is not None}
            elif name == "tools":
                state = self.__pydantic_private__  # (a translation's record; no call without one)
                noted = _noted_tools(state[TOOLS_NOTE], value) if state is not None and TOOLS_NOTE in state else None
                out[name] = noted if noted is not None else _FIELDS.serializer(name).to_python(value, **_DUMP)
            else:
                out[name] = _FIELDS.serializer(name).to_python(value, **_DUMP)
        return out


# Each rule after the message check, in order, with the fields without which it cannot fail.
_RULES: FieldRules[ChatCompletionRequest] = FieldRules(
    (frozenset({"max_completion_tokens"}), ChatCompletionRequest._check_max_tokens_pair),
    (frozenset({"top_logprobs"}), ChatCompletionRequest._check_top_logprobs),
    (frozenset({"stream_options"}), ChatCompletionRequest._check_stream_options),
    (frozenset({"logit_bias"}), ChatCompletionRequest._check_logit_bias_keys),
    (frozenset({"tools", "tool_choice", "parallel_tool_calls"}), ChatCompletionRequest._check_tools),
    (frozenset({"function_call"}), ChatCompletionRequest._check_functions),
    (frozenset({"modalities"}), ChatCompletionRequest._check_audio),
    (frozenset({"continue_final_message"}), ChatCompletionRequest._check_template_flags),
    (frozenset({"min_tokens"}), ChatCompletionRequest._check_min_tokens),
    (frozenset({"prompt_logprobs"}), ChatCompletionRequest._check_prompt_logprobs),
    (frozenset({"logprob_token_ids"}), ChatCompletionRequest._check_logprob_token_ids),
    (frozenset({"routed_experts_prompt_start"}), ChatCompletionRequest._check_routed_experts),
    (
        frozenset({"response_format", *GUIDED_FIELDS, "structured_outputs"})
        | {"guided_whitespace_pattern", "guided_decoding_backend"},
        ChatCompletionRequest._check_one_constraint,
    ),
)


def _noted_tools(note: tuple[tuple[Any, str, dict[str, Any]], ...], tools: list[Any]) -> list[dict[str, Any]] | None:
    """The tools' upstream form from their record (:data:`TOOLS_NOTE`), or None where the record is not
    of these tools. Each tool's and spec's dict is a fresh copy (callers edit the result); a JSON Schema
    inside is shared, which no caller edits (the serializer's copy of every node is what the record
    saves: most of an agent's request)."""
    if len(note) != len(tools):
        return None
    out = []
    for tool, (made, kind, spec) in zip(tools, note, strict=True):
        if tool is not made:
            return None
        out.append({"type": kind, kind: dict(spec)})
    return out


# upstream_fields' fast path: each field's place in the declared order, and its serializer.
_FIELDS = FieldDumps(ChatCompletionRequest)
_PLAIN: frozenset[type] = frozenset({str, int, float, bool})
_DUMP: dict[str, Any] = {"by_alias": True, "exclude_unset": True, "exclude_none": True}
