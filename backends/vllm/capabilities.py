"""What a vLLM server honours, one table per endpoint, built per version (and tool parser for chat).

The version boundaries live in ``backends.vllm.versions``; this module turns a version's
features into the frozen tables the router checks per request. Tables are computed once per
distinct feature set (cached), never per request.

An unknown version (no ``GET /version`` answer and no ``version:`` pin) gets the tables that
cannot fail open: structured output refused, best_of and greedy ``n`` emulated (both work on
every version).
"""

from __future__ import annotations

from functools import lru_cache

from backends.capabilities import EMPTY_PROMPT, Capabilities, Level, Rule, empty_prompt
from backends.chat_capabilities import CHAT_FIELDS, OPENAI_ONLY_FIELDS, ChatCapabilities, ValueRule
from backends.pooling_capabilities import PoolingCapabilities, PoolingRule, embedding_table, rerank_table
from backends.responses.capabilities import ResponsesCapabilities
from backends.vllm.versions import (
    BOUNDARIES,
    CHAT_BOUNDARIES,
    COMPLETIONS_EXTRAS_SINCE,
    VLLM_MAX_LOGPROBS,
    VLLMChatFeatures,
    VLLMFeatures,
    VLLMVersion,
)
from schemas.chat_messages import JSONSchemaResponseFormat
from schemas.completions import CompletionRequest
from schemas.embeddings import VLLM_EMBEDDING_EXTRAS
from schemas.rerank import VLLM_RERANK_EXTRAS

__all__ = [
    "POOLING_BOUNDARIES",
    "VLLM_CAPABILITIES",
    "capabilities_for",
    "vllm_chat_capabilities",
    "vllm_pooling_tables",
    "vllm_responses_capabilities",
]

N, T, E, U = Level.NATIVE, Level.TRANSLATED, Level.EMULATED, Level.UNSUPPORTED

# --- completions ------------------------------------------------------------------------------

_GUIDES = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_UNKNOWN = "the vLLM server's version is unknown (GET /version failed and the backend has no `version:` pin), so "


def refusal_reasons(features: VLLMFeatures) -> dict[str, str]:
    """Why each field this version cannot honour is refused (field -> reason)."""
    v = features.label
    reasons: dict[str, str] = _answer_reasons(features)
    if not features.structured_output:
        for name in (*_GUIDES, "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs"):
            reasons[name] = (
                _UNKNOWN
                + "the gateway cannot send a structured-output constraint in a form it is sure the server applies"
            )
        return reasons | _beam_reasons(features)
    if not features.per_request_backend:
        reasons["guided_decoding_backend"] = (
            f"vLLM {v} selects the structured-output backend server-wide "
            "(--structured-outputs-config); a per-request backend cannot be honoured"
        )
    if not features.whitespace_pattern:
        reasons["guided_whitespace_pattern"] = (
            f"vLLM {v} (V1 engine) applies no per-request whitespace pattern to JSON constraints"
        )
    return reasons | _beam_reasons(features)


def _answer_reasons(features: VLLMFeatures) -> dict[str, str]:
    """Fields a version would ignore (from 0.10.1 unknown fields are dropped with HTTP 200)."""
    v = features.label
    reasons: dict[str, str] = {}
    if features.version is None:
        reasons["return_tokens_as_token_ids"] = _UNKNOWN + "the gateway cannot tell whether it would be ignored"
    if not features.return_token_ids:
        reasons["return_token_ids"] = (
            _UNKNOWN + "the gateway cannot tell whether it would be ignored"
            if features.version is None
            else f"vLLM {v} has no return_token_ids (added in 0.11)"
        )
    if not features.truncation_side:
        reasons["truncation_side"] = (
            _UNKNOWN + "the gateway cannot tell whether it would be ignored"
            if features.version is None
            else f"vLLM {v} has no truncation_side (first in 0.32)"
        )
    return reasons


def _extras_reasons(features: VLLMFeatures) -> dict[str, str]:
    """vLLM's own fields (``schemas.vllm_extras``) a version's /v1/completions does not honour.

    Completions only: chat gates the same fields by its own boundaries (:func:`vllm_chat_capabilities`).
    """
    version = features.version
    if version is None:
        return dict.fromkeys(COMPLETIONS_EXTRAS_SINCE, _UNKNOWN + "the gateway cannot tell whether it honours it")
    return {
        name: f"vLLM {version} does not honour {name} in completions (from {since})"
        for name, since in COMPLETIONS_EXTRAS_SINCE.items()
        if version < since
    }


def _beam_reasons(features: VLLMFeatures) -> dict[str, str]:
    if features.early_stopping:
        return {}
    return {
        "early_stopping": f"vLLM {features.label} beam search has no early_stopping "
        "(removed in 0.6.3; newer servers ignore the field)"
    }


# StructuredOutputsParams options with no top-level guided_* field before 0.11.
_STRUCTURED_ONLY = (
    "json_object",
    "disable_fallback",
    "disable_any_whitespace",
    "disable_additional_properties",
    "structural_tag",
)


def _structured_rules(features: VLLMFeatures) -> tuple[Rule, ...]:
    """What a ``structured_outputs`` a version accepts cannot carry (by value, so a Rule)."""
    rules: list[Rule] = []
    if features.structured_output and not features.structured_outputs:
        rules.append(
            Rule(
                "structured_outputs",
                f"vLLM {features.label} takes only json, regex, choice, grammar and whitespace_pattern "
                f"(as guided_*); {', '.join(_STRUCTURED_ONLY)} need vLLM >= 0.11",
                lambda r: (
                    r.structured_outputs is not None
                    and any(getattr(r.structured_outputs, name) not in (None, False) for name in _STRUCTURED_ONLY)
                ),
            )
        )
    if features.structured_output and not features.whitespace_pattern:
        rules.append(
            Rule(
                "structured_outputs",
                f"vLLM {features.label} (V1 engine) applies no per-request whitespace_pattern to JSON constraints",
                lambda r: r.structured_outputs is not None and r.structured_outputs.whitespace_pattern is not None,
            )
        )
    return tuple(rules)


def _no_older_form(request: CompletionRequest) -> bool:
    """A ``response_format`` no version before 0.12 applies: a structural tag, a ``json_schema`` without a schema."""
    fmt = request.response_format
    if fmt is None or fmt.type in ("text", "json_object"):
        return False
    if fmt.type == "structural_tag":
        return True
    return isinstance(fmt, JSONSchemaResponseFormat) and fmt.json_schema.schema_ is None


def _response_format_rules(features: VLLMFeatures) -> tuple[Rule, ...]:
    """What a version before 0.12 cannot apply in ``response_format`` (the other forms are translated).

    One rule, so a request pays one call for it (the rules run on every request).
    """
    if features.version is None or features.version >= BOUNDARIES["response_format"]:
        return ()
    why = (
        f"vLLM {features.label} ignores a structural_tag response_format in completions (applied from 0.12), "
        "and a json_schema one without a schema has no older form"
    )
    return (Rule("response_format", why, _no_older_form),)


# vLLM 0.32 refuses (400) a cache_salt over 128 characters or holding '@', '/', '\\' or NUL, the
# separators of LMCache's keys (``validate_cache_salt``, vllm/entrypoints/generate/base/protocol.py,
# vLLM PR #51444, in completions, chat, Responses and pooling). Earlier versions take any non-empty
# salt (the schema's 1..1024), so the rule is per version, checked here rather than in the schema.
CACHE_SALT_RULE_SINCE = VLLMVersion(0, 32, 0)
_SALT_MAX = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")


def _salt_refused(salt: str | None) -> bool:
    return salt is not None and (len(salt) > _SALT_MAX or not _SALT_FORBIDDEN.isdisjoint(salt))


def _salt_why(version: VLLMVersion | None) -> str | None:
    """Why a salt is refused on ``version`` (None: no bound beyond the schema's)."""
    if version is None or version < CACHE_SALT_RULE_SINCE:
        return None  # an unknown version refuses cache_salt altogether (its level)
    return f"vLLM {version} takes a cache_salt of at most {_SALT_MAX} characters without '@', '/', '\\' or NUL"


def _salt_rules(features: VLLMFeatures) -> tuple[Rule, ...]:
    why = _salt_why(features.version)
    return () if why is None else (Rule("cache_salt", why, lambda r: _salt_refused(r.cache_salt)),)


_EMPTY_PROMPT_RULE = Rule(
    "prompt", f'{EMPTY_PROMPT}: vLLM refuses it ("prompt ... must be provided and non-empty")', empty_prompt
)


@lru_cache(maxsize=32)
def capabilities_for(features: VLLMFeatures) -> Capabilities:
    """The capability table of one version (cached: computed once per feature set)."""
    reasons = refusal_reasons(features) | _extras_reasons(features)
    levels: dict[str, Level] = dict.fromkeys(reasons, Level.UNSUPPORTED)
    if features.structured_output and features.structured_outputs:
        for name in _GUIDES:
            levels[name] = Level.TRANSLATED
    elif features.structured_output:
        levels["structured_outputs"] = Level.TRANSLATED  # sent as guided_* (< 0.11)
    if not features.native_best_of:
        levels["best_of"] = Level.EMULATED
    if not features.greedy_n:
        levels["n"] = Level.EMULATED  # n > 1 with temperature 0: replicated greedy choice
    if features.version is None:
        levels["response_format"] = Level.UNSUPPORTED
        reasons["response_format"] = (
            _UNKNOWN + "the gateway cannot tell whether it applies the format (vLLM 0.11 ignores json_object alone)"
        )
    elif features.version < BOUNDARIES["response_format"]:
        levels["response_format"] = Level.TRANSLATED  # as guided_json (< 0.11) or structured_outputs (0.11)
    limits = {"logprobs": VLLM_MAX_LOGPROBS, "prompt_logprobs": VLLM_MAX_LOGPROBS}
    rules = (
        _EMPTY_PROMPT_RULE, *_structured_rules(features), *_response_format_rules(features), *_salt_rules(features)
    )  # fmt: skip
    table = Capabilities.of(Level.NATIVE, **levels).with_rules(rules).with_limits(limits)
    return table.with_reasons(reasons)


# Before any version is known: nothing that could fail open.
VLLM_CAPABILITIES: Capabilities = capabilities_for(VLLMFeatures.of(None))

# --- chat (spec "vLLM ChatCompletionRequest by version") --------------------------------------


@lru_cache(maxsize=64)
def vllm_chat_capabilities(features: VLLMChatFeatures) -> ChatCapabilities:
    """The chat table of one vLLM server (cached: computed once per feature set)."""
    v = features.base.label
    unknown = "the vLLM server's version is unknown (no GET /version answer and no `version:` pin)"
    levels: dict[str, Level] = dict.fromkeys(OPENAI_ONLY_FIELDS, U)
    forms: dict[str, Level] = {"messages=file": U, "tools=custom": U, "tool_choice=custom": U}
    forms["tool_choice=allowed_tools"] = U
    forms["stream_options=include_obfuscation"] = U
    reasons = {k: w for k, w in refusal_reasons(features.base).items() if k in CHAT_FIELDS}
    # vLLM >= 0.6.5 ignores unknown keys with HTTP 200: forwarding these would drop them silently.
    reasons |= dict.fromkeys(OPENAI_ONLY_FIELDS, "an OpenAI-only field that vLLM ignores")
    levels |= dict.fromkeys(reasons, U)
    if features.base.structured_outputs:
        levels |= dict.fromkeys(("guided_json", "guided_regex", "guided_choice", "guided_grammar"), T)
    else:
        levels["structured_outputs"] = U
        reasons["structured_outputs"] = f"vLLM {v} has no structured_outputs field (from 0.11)"
    if not features.base.greedy_n:
        levels["n"] = E  # n > 1 with temperature 0: replicated greedy choice

    def gate(key: str, boundary: str, level_before: Level = U) -> None:
        has = features.since(boundary)
        if has:
            return
        target = forms if "=" in key else levels
        target[key] = level_before
        if level_before is U:
            since = CHAT_BOUNDARIES[boundary]
            reasons[key] = unknown if has is None else f"vLLM {v} does not honour {key} (from {since})"

    gate("max_completion_tokens", "max_completion_tokens", T)  # sent as max_tokens
    # Older servers refuse these with 400 (extra=forbid through 0.6.4), so only a known-old
    # version needs the gateway to refuse them; an unknown one answers for itself.
    if features.since("max_completion_tokens") is False:
        gate("request_id", "max_completion_tokens")
    if features.since("continue_final_message") is False:
        gate("continue_final_message", "continue_final_message")
        gate("priority", "continue_final_message")
    gate("reasoning_effort", "reasoning_effort")
    gate("allowed_token_ids", "allowed_token_ids")  # completions had it first; an older chat ignores it
    gate("include_reasoning", "reasoning_effort")
    for name in ("cache_salt", "kv_transfer_params"):
        gate(name, "cache_salt")
    for name in ("bad_words", "vllm_xargs"):
        gate(name, "bad_words")
    gate("repetition_detection", "repetition_detection")
    gate("mm_processor_kwargs", "mm_processor_kwargs")
    gate("watermarking", "watermarking")
    for name in (
        "logprob_token_ids", "session_id", "thinking_token_budget", "stream_interval", "media_io_kwargs",
        "ec_transfer_params", "routed_experts_prompt_start",
    ):  # fmt: skip
        gate(name, "vllm_0_32_extras")
    gate("parallel_tool_calls=false", "parallel_tool_calls_false")
    gate("tools=strict", "tools_strict")  # an older server would hand back unconstrained arguments
    if features.since("tools_strict") is False:
        since = CHAT_BOUNDARIES["tools_strict"]
        reasons["tools=strict"] = f"vLLM {v} cannot enforce a function tool's strict: true (from {since})"
    if features.since("tool_choice_none") is False:
        gate("tool_choice=none", "tool_choice_none")
    if features.since("tool_choice_required") is False:
        gate("tool_choice=required", "tool_choice_required")
    if features.tool_parser is None:
        no_parser = "the vLLM server runs no tool parser (set the backend's `tool_parser:`)"
        forms["tool_choice=auto"] = U
        reasons["tool_choice=auto"] = no_parser
        needs = features.since("forced_tools_need_parser")
        for form in ("required", "function"):
            if needs is not False and forms.get(f"tool_choice={form}") is not U:
                forms[f"tool_choice={form}"] = U
                reasons[f"tool_choice={form}"] = no_parser if needs else f"{no_parser}; {unknown}"
    limits = {"prompt_logprobs": VLLM_MAX_LOGPROBS}  # the server's --max-logprobs default; -1 ("all") over it
    why = _salt_why(features.base.version)
    rules = () if why is None else (ValueRule("cache_salt", why, lambda r: _salt_refused(r.cache_salt)),)
    return ChatCapabilities.build(N, levels, forms, limits=limits, reasons=reasons, rules=rules)


@lru_cache(maxsize=64)
def vllm_responses_capabilities(features: VLLMChatFeatures) -> ResponsesCapabilities:
    """The Responses table of one vLLM server: through its chat dialect, so derived from its chat table."""
    return ResponsesCapabilities.bridged(vllm_chat_capabilities(features))


# --- embeddings and rerank (translator: backends.vllm.pooling) -------------------------------
# vLLM ignores unknown pooling fields (HTTP 200, the field dropped): a base64 answer in float32 for
# a client that asked float16 would decode to garbage, so an extra a version lacks is refused.
# First versions: 0.32.0 from its wheel (``vllm/entrypoints/pooling``); the earlier ones from vLLM's
# pull requests (the encoding options landed in October 2025: 0.12.0 is the first release sure to
# have them). An unknown version gets the extras every pooling server has had
# (``truncate_prompt_tokens``, ``add_special_tokens``, ``dimensions``), nothing that could fail open.

# First version with each pooling extra (the key is the field, or ``field=form``).
POOLING_BOUNDARIES: dict[str, VLLMVersion] = {
    "embed_dtype": VLLMVersion(0, 12, 0),
    "endianness": VLLMVersion(0, 12, 0),
    "encoding_format=bytes": VLLMVersion(0, 12, 0),
    "encoding_format=bytes_only": VLLMVersion(0, 12, 0),
    "use_activation": VLLMVersion(0, 12, 0),
    "priority": VLLMVersion(0, 12, 0),
    "truncation_side": VLLMVersion(0, 32, 0),
    "padding": VLLMVersion(0, 32, 0),
    "cache_salt": VLLMVersion(0, 32, 0),
    "max_tokens_per_query": VLLMVersion(0, 32, 0),
    "max_tokens_per_doc": VLLMVersion(0, 32, 0),
    "instruction": VLLMVersion(0, 32, 0),
    # Chat-style embeddings: messages from 0.6.4 (vLLM #9759), add_generation_prompt from 0.11.0
    # (#23931); chat_template_kwargs reached the template (#45173), a batch of conversations and
    # continue_final_message are known from 0.32.0's wheel on.
    "messages": VLLMVersion(0, 6, 4),
    "chat_template": VLLMVersion(0, 6, 4),
    "add_generation_prompt": VLLMVersion(0, 11, 0),
    "continue_final_message": VLLMVersion(0, 32, 0),
    "chat_template_kwargs": VLLMVersion(0, 32, 0),
    "messages=batch": VLLMVersion(0, 32, 0),
}
# ``normalize``: honoured from 0.10.2 until 0.32 refused it ("use use_activation instead").
NORMALIZE_SINCE, NORMALIZE_UNTIL = VLLMVersion(0, 10, 2), VLLMVersion(0, 32, 0)


def _missing(key: str, version: VLLMVersion | None) -> str | None:
    """Why ``key`` is refused on ``version`` (None: honoured)."""
    first = POOLING_BOUNDARIES[key]
    what = "a batch of conversations in messages" if key == "messages=batch" else key.split("=")[-1]
    if version is None:
        return _UNKNOWN + f"the gateway cannot tell whether it has {what} (vLLM >= {first})"
    if version < first:
        return f"vLLM {version} has no {what} (first in {first})"
    return None


def _normalize_reason(version: VLLMVersion | None) -> str | None:
    if version is None:
        return _UNKNOWN + "the gateway cannot tell whether it has normalize"
    if version >= NORMALIZE_UNTIL:
        return f"vLLM {version} removed normalize; use use_activation (false: not normalised)"
    if version < NORMALIZE_SINCE:
        return f"vLLM {version} has no normalize (first in {NORMALIZE_SINCE})"
    return None


@lru_cache(maxsize=32)
def vllm_pooling_tables(version: VLLMVersion | None) -> tuple[PoolingCapabilities, PoolingCapabilities]:
    """The embeddings and rerank tables of one vLLM version (cached)."""
    levels: dict[str, Level] = dict.fromkeys(VLLM_EMBEDDING_EXTRAS, N)
    forms: dict[str, Level] = {"input=token_ids": N, "encoding_format=base64": N}
    reasons: dict[str, str] = {}
    for key in (k for k in POOLING_BOUNDARIES if k.split("=")[0] in levels or "=" in k):
        why = _missing(key, version)
        if why is None:
            if "=" in key:
                forms[key] = N
            continue
        reasons[key] = why
        if "=" in key:
            forms[key] = U
        else:
            levels[key] = U
    normalize = _normalize_reason(version)
    if normalize is not None:
        levels["normalize"], reasons["normalize"] = U, normalize
    why = _salt_why(version)
    salt = () if why is None else (PoolingRule("cache_salt", why, lambda r: _salt_refused(r.cache_salt)),)
    embeddings = embedding_table(N, levels, forms, reasons=reasons, rules=salt)

    rerank_levels: dict[str, Level] = {**dict.fromkeys(VLLM_RERANK_EXTRAS, N), "return_documents": T}
    rerank_reasons: dict[str, str] = {}
    for name in (*VLLM_RERANK_EXTRAS, "max_tokens_per_doc"):
        why = _missing(name, version) if name in POOLING_BOUNDARIES else None
        if why is not None:
            rerank_levels[name], rerank_reasons[name] = U, why
    rerank = rerank_table(N, rerank_levels, {"documents=object": T}, reasons=rerank_reasons)
    return embeddings, rerank
