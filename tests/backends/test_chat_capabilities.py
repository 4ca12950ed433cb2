"""Chat capability tables: field levels, value-level forms, limits and exclusive sets per backend type.

Every case is a request a client could send and the refusal (param and matched key) the table must
give, or None when the backend can honour it; the vLLM cases walk the version boundaries of the spec.
"""

from __future__ import annotations

from typing import Any

import pytest

from backends.capabilities import Level
from backends.chat_capabilities import (
    CHAT_FIELDS,
    OPENAI_ONLY_FIELDS,
    VLLM_CHAT_EXTRAS,
    ChatCapabilities,
    request_forms,
)
from backends.mock.capabilities import MOCK_CHAT
from backends.native.llamacpp_capabilities import LLAMACPP_CHAT
from backends.native.ollama_capabilities import OLLAMA_CHAT
from backends.native.tgi_capabilities import TGI_CHAT
from backends.openai.capabilities import OPENAI_CHAT
from backends.vllm.capabilities import vllm_chat_capabilities
from backends.vllm.versions import VLLMChatFeatures, VLLMVersion
from schemas.chat import ChatCompletionRequest

FN = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CUSTOM = {"type": "custom", "custom": {"name": "g"}}
NAMED = {"type": "function", "function": {"name": "f"}}
IMAGE_DATA = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
IMAGE_REMOTE = {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}
FILE = {"type": "file", "file": {"file_id": "file-1"}}


def req(*parts: dict[str, Any], **fields: Any) -> ChatCompletionRequest:
    content: Any = [{"type": "text", "text": "hi"}, *parts] if parts else "hi"
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    )


def refusal(table: ChatCapabilities, request: ChatCompletionRequest) -> tuple[str, str] | None:
    found = table.first_refusal(request)
    return None if found is None else (found.param, found.key)


def vllm(major: int, minor: int, patch: int = 0, parser: str | None = None) -> ChatCapabilities:
    return vllm_chat_capabilities(VLLMChatFeatures.of(VLLMVersion(major, minor, patch), parser))


UNKNOWN_VLLM = vllm_chat_capabilities(VLLMChatFeatures.of(None))


def test_forms_of_a_request_in_schema_order() -> None:
    request = req(
        IMAGE_REMOTE, AUDIO,
        tools=[FN, CUSTOM], tool_choice="required", parallel_tool_calls=False, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, response_format={"type": "json_object"},
    )  # fmt: skip
    assert list(request_forms(request)) == [
        ("messages", "text"), ("messages", "image_url"), ("messages", "remote_image_url"), ("messages", "input_audio"),
        ("response_format", "json_object"), ("stream_options", "include_usage"), ("tools", "function"),
        ("tools", "custom"), ("tool_choice", "required"), ("parallel_tool_calls", "false"),
    ]  # fmt: skip


def test_every_table_covers_every_chat_field() -> None:
    for table in (OPENAI_CHAT, TGI_CHAT, OLLAMA_CHAT, LLAMACPP_CHAT, UNKNOWN_VLLM, vllm(0, 33)):
        assert set(table.fields.levels) == set(CHAT_FIELDS)
        assert {name for name, _ in table.rows()} >= set(CHAT_FIELDS)


def test_unknown_field_in_a_table_fails_at_build() -> None:
    with pytest.raises(ValueError, match="prompt"):
        ChatCapabilities.build(Level.NATIVE, {"prompt": Level.NATIVE})
    with pytest.raises(ValueError, match="tool_choise"):
        ChatCapabilities.build(Level.NATIVE, {}, {"tool_choise=auto": Level.UNSUPPORTED})


# (table id, request fields / parts, expected (param, key) or None)
def _cases() -> list[tuple[str, ChatCapabilities, ChatCompletionRequest, tuple[str, str] | None]]:
    tools: dict[str, Any] = {"tools": [FN]}
    return [
        # openai: every OpenAI field; vLLM's extras are refused, neutral values pass
        ("openai-all-openai", OPENAI_CHAT, req(FILE, AUDIO, store=True, metadata={"a": "b"}, tools=[FN, CUSTOM],
                                              tool_choice="required", modalities=["text", "audio"],
                                              audio={"voice": "alloy", "format": "wav"}), None),
        ("openai-top_k", OPENAI_CHAT, req(top_k=5), ("top_k", "top_k")),
        ("openai-top_k-neutral", OPENAI_CHAT, req(top_k=-1), None),
        ("openai-continuous", OPENAI_CHAT, req(stream=True, stream_options={"continuous_usage_stats": True}),
         ("stream_options", "stream_options=continuous_usage_stats")),
        # TGI
        ("tgi-basic", TGI_CHAT, req(IMAGE_REMOTE, max_completion_tokens=5, n=3, **tools, tool_choice=NAMED), None),
        ("tgi-audio", TGI_CHAT, req(AUDIO), ("messages", "messages=input_audio")),
        ("tgi-file", TGI_CHAT, req(FILE), ("messages", "messages=file")),
        ("tgi-presence", TGI_CHAT, req(presence_penalty=0.5), ("presence_penalty", "presence_penalty")),
        ("tgi-presence-neutral", TGI_CHAT, req(presence_penalty=0.0), None),
        ("tgi-top-logprobs-5", TGI_CHAT, req(logprobs=True, top_logprobs=5), None),
        ("tgi-top-logprobs-6", TGI_CHAT, req(logprobs=True, top_logprobs=6), ("top_logprobs", "top_logprobs>5")),
        ("tgi-grammar+tools", TGI_CHAT, req(**tools, response_format={"type": "json_object"}),
         ("response_format", "tools+response_format")),
        ("tgi-text-format+tools", TGI_CHAT, req(**tools, response_format={"type": "text"}), None),
        ("tgi-allowed", TGI_CHAT, req(**tools, tool_choice={"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [NAMED]}}), ("tool_choice", "tool_choice=allowed_tools")),
        ("tgi-store", TGI_CHAT, req(store=True), ("store", "store")),
        ("tgi-store-neutral", TGI_CHAT, req(store=False), None),
        # Ollama
        ("ollama-data-image", OLLAMA_CHAT, req(IMAGE_DATA, **tools, tool_choice="auto", reasoning_effort="low"), None),
        ("ollama-remote-image", OLLAMA_CHAT, req(IMAGE_REMOTE), ("messages", "messages=remote_image_url")),
        ("ollama-required", OLLAMA_CHAT, req(**tools, tool_choice="required"), ("tool_choice", "tool_choice=required")),
        ("ollama-named", OLLAMA_CHAT, req(**tools, tool_choice=NAMED), ("tool_choice", "tool_choice=function")),
        ("ollama-none", OLLAMA_CHAT, req(**tools, tool_choice="none"), None),
        ("ollama-serial", OLLAMA_CHAT, req(**tools, parallel_tool_calls=False),
         ("parallel_tool_calls", "parallel_tool_calls=false")),
        ("ollama-logit-bias", OLLAMA_CHAT, req(logit_bias={"1": 5}), ("logit_bias", "logit_bias")),
        # llama.cpp
        ("llamacpp-basic", LLAMACPP_CHAT, req(AUDIO, **tools, tool_choice="required", parallel_tool_calls=False,
                                              logit_bias={"1": 2}, logprobs=True, top_logprobs=3), None),
        ("llamacpp-named", LLAMACPP_CHAT, req(**tools, tool_choice=NAMED), ("tool_choice", "tool_choice=function")),
        ("llamacpp-logprobs-tools-stream", LLAMACPP_CHAT, req(**tools, logprobs=True, stream=True),
         ("stream", "logprobs+tools+stream")),
        ("llamacpp-logprobs-tools", LLAMACPP_CHAT, req(**tools, logprobs=True), None),
        ("llamacpp-min-tokens", LLAMACPP_CHAT, req(min_tokens=3), ("min_tokens", "min_tokens")),
        # vLLM by version
        ("vllm-0.6.3-none", vllm(0, 6, 3), req(**tools, tool_choice="none"), ("tool_choice", "tool_choice=none")),
        ("vllm-0.6.4-none", vllm(0, 6, 4), req(**tools, tool_choice="none"), None),
        ("vllm-0.8.2-required", vllm(0, 8, 2), req(**tools, tool_choice="required"),
         ("tool_choice", "tool_choice=required")),
        ("vllm-0.8.3-required", vllm(0, 8, 3), req(**tools, tool_choice="required"), None),
        ("vllm-0.13-named-no-parser", vllm(0, 13), req(**tools, tool_choice=NAMED), None),
        ("vllm-0.14-named-no-parser", vllm(0, 14), req(**tools, tool_choice=NAMED),
         ("tool_choice", "tool_choice=function")),
        ("vllm-0.14-named-parser", vllm(0, 14, parser="hermes"), req(**tools, tool_choice=NAMED), None),
        ("vllm-auto-no-parser", vllm(0, 33), req(**tools, tool_choice="auto"), ("tool_choice", "tool_choice=auto")),
        ("vllm-auto-parser", vllm(0, 33, parser="hermes"), req(**tools, tool_choice="auto"), None),
        ("vllm-0.11-serial", vllm(0, 11), req(**tools, parallel_tool_calls=False),
         ("parallel_tool_calls", "parallel_tool_calls=false")),
        ("vllm-0.12-serial", vllm(0, 12), req(**tools, parallel_tool_calls=False), None),
        ("vllm-custom-tool", vllm(0, 33), req(tools=[CUSTOM]), ("tools", "tools=custom")),
        ("vllm-file", vllm(0, 33), req(FILE), ("messages", "messages=file")),
        ("vllm-audio", vllm(0, 33), req(AUDIO, IMAGE_REMOTE), None),
        ("vllm-store", vllm(0, 33), req(store=True), ("store", "store")),
        ("vllm-verbosity", vllm(0, 33), req(verbosity="low"), ("verbosity", "verbosity")),
        ("vllm-0.10.0-effort", vllm(0, 10, 0), req(reasoning_effort="low"), ("reasoning_effort", "reasoning_effort")),
        ("vllm-0.10.1-effort", vllm(0, 10, 1), req(reasoning_effort="low"), None),
        ("vllm-0.6.2-continue", vllm(0, 6, 2), req(continue_final_message=True, messages=[
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
         ("continue_final_message", "continue_final_message")),
        ("vllm-0.6.3-priority", vllm(0, 6, 3), req(priority=1), None),
        ("vllm-0.6.3-request-id", vllm(0, 6, 3), req(request_id="r"), ("request_id", "request_id")),
        ("vllm-0.11-guided", vllm(0, 11), req(guided_json={"type": "object"}), None),
        ("vllm-0.10-structured", vllm(0, 10, 1), req(structured_outputs={"regex": "a"}),
         ("structured_outputs", "structured_outputs")),
        ("vllm-0.12-structured", vllm(0, 12), req(structured_outputs={"regex": "a"}), None),
        ("vllm-0.12-whitespace", vllm(0, 12), req(guided_json={}, guided_whitespace_pattern=" "),
         ("guided_whitespace_pattern", "guided_whitespace_pattern")),
        ("vllm-obfuscation-false", vllm(0, 33), req(stream=True, stream_options={"include_obfuscation": False}), None),
        ("vllm-obfuscation-true", vllm(0, 33), req(stream=True, stream_options={"include_obfuscation": True}),
         ("stream_options", "stream_options=include_obfuscation")),
        ("vllm-json-schema", vllm(0, 6, 0), req(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
         None),
        # vLLM's extras that completions had first (issue 21): native where the version honours them
        ("vllm-prompt-logprobs-20", vllm(0, 32), req(prompt_logprobs=20), None),
        ("vllm-prompt-logprobs-21", vllm(0, 32), req(prompt_logprobs=21), ("prompt_logprobs", "prompt_logprobs>20")),
        ("vllm-prompt-logprobs-all", vllm(0, 32), req(prompt_logprobs=-1), ("prompt_logprobs", "prompt_logprobs>20")),
        ("vllm-0.10-token-ids", vllm(0, 10, 1), req(return_token_ids=True), ("return_token_ids", "return_token_ids")),
        ("vllm-0.10-token-ids-off", vllm(0, 10, 1), req(return_token_ids=False), None),
        ("vllm-0.11-token-ids", vllm(0, 11), req(return_token_ids=True, return_tokens_as_token_ids=True), None),
        ("vllm-0.12-truncation-side", vllm(0, 12), req(truncate_prompt_tokens=5, truncation_side="left"),
         ("truncation_side", "truncation_side")),
        ("vllm-0.32-truncation-side", vllm(0, 32), req(truncate_prompt_tokens=5, truncation_side="left"), None),
        ("vllm-0.9.0-allowed", vllm(0, 9, 0), req(allowed_token_ids=[1]), ("allowed_token_ids", "allowed_token_ids")),
        ("vllm-0.9.2-allowed", vllm(0, 9, 2), req(allowed_token_ids=[1]), None),
        ("vllm-beam", vllm(0, 32), req(use_beam_search=True, n=2, temperature=0, stream=True), None),
        ("vllm-0.8.5-salt", vllm(0, 8, 5), req(cache_salt="s"), ("cache_salt", "cache_salt")),
        ("vllm-0.9.0-salt", vllm(0, 9, 0), req(cache_salt="s", kv_transfer_params={"a": 1}), None),
        ("vllm-0.9.0-bad-words", vllm(0, 9, 0), req(bad_words=["x"]), ("bad_words", "bad_words")),
        ("vllm-0.9.0-no-bad-words", vllm(0, 9, 0), req(bad_words=[], vllm_xargs={}), None),
        ("vllm-0.9.2-xargs", vllm(0, 9, 2), req(bad_words=["x"], vllm_xargs={"a": 1}), None),
        ("vllm-0.10.0-reasoning-off", vllm(0, 10, 0), req(include_reasoning=False),
         ("include_reasoning", "include_reasoning")),
        ("vllm-0.10.0-reasoning-on", vllm(0, 10, 0), req(include_reasoning=True), None),
        ("vllm-0.17-repetition", vllm(0, 17), req(repetition_detection={"max_pattern_size": 3, "min_count": 2}),
         ("repetition_detection", "repetition_detection")),
        ("vllm-0.18-repetition", vllm(0, 18), req(repetition_detection={"max_pattern_size": 3, "min_count": 2}), None),
        ("vllm-0.24-session", vllm(0, 24), req(session_id="s"), ("session_id", "session_id")),
        ("vllm-0.32-newest", vllm(0, 32), req(session_id="s", stream_interval=2, thinking_token_budget=5,
                                               logprobs=True, logprob_token_ids=[1]), None),
        ("vllm-0.7.0-mm-kwargs", vllm(0, 7, 0), req(mm_processor_kwargs={"a": 1}),
         ("mm_processor_kwargs", "mm_processor_kwargs")),
        ("vllm-0.7.3-mm-kwargs", vllm(0, 7, 3), req(mm_processor_kwargs={"a": 1}), None),
        ("vllm-0.29-watermark", vllm(0, 29), req(watermarking=True), ("watermarking", "watermarking")),
        ("vllm-0.29-no-watermark", vllm(0, 29), req(watermarking=False), None),
        ("vllm-0.30-watermark", vllm(0, 30), req(watermarking=False), None),
        ("vllm-0.31-ec", vllm(0, 31), req(ec_transfer_params={"a": 1}), ("ec_transfer_params", "ec_transfer_params")),
        ("vllm-0.31-media", vllm(0, 31), req(media_io_kwargs={"video": {}}), ("media_io_kwargs", "media_io_kwargs")),
        ("vllm-0.32-multimodal", vllm(0, 32), req(media_io_kwargs={"video": {"num_frames": 4}},
                                                  ec_transfer_params={"a": 1}, routed_experts_prompt_start=2), None),
        ("vllm-unknown-salt", UNKNOWN_VLLM, req(cache_salt="s"), ("cache_salt", "cache_salt")),
        ("vllm-unknown-experts", UNKNOWN_VLLM, req(routed_experts_prompt_start=1),
         ("routed_experts_prompt_start", "routed_experts_prompt_start")),
        ("openai-experts-off", OPENAI_CHAT, req(routed_experts_prompt_start=0, watermarking=False), None),
        ("openai-watermark", OPENAI_CHAT, req(watermarking=True), ("watermarking", "watermarking")),
        ("mock-salt", MOCK_CHAT, req(cache_salt="s"), ("cache_salt", "cache_salt")),
        ("tgi-bad-words", TGI_CHAT, req(bad_words=["x"]), ("bad_words", "bad_words")),
        ("openai-prompt-logprobs", OPENAI_CHAT, req(prompt_logprobs=1), ("prompt_logprobs", "prompt_logprobs")),
        ("openai-beam-off", OPENAI_CHAT, req(use_beam_search=False, return_token_ids=False), None),
        ("tgi-token-ids", TGI_CHAT, req(return_token_ids=True), ("return_token_ids", "return_token_ids")),
        ("ollama-truncate", OLLAMA_CHAT, req(truncate_prompt_tokens=5), ("truncate_prompt_tokens",) * 2),
        ("llamacpp-allowed", LLAMACPP_CHAT, req(allowed_token_ids=[1]), ("allowed_token_ids",) * 2),
        # unknown vLLM version: nothing that could come back unconstrained or silently ignored
        ("vllm-unknown-guided", UNKNOWN_VLLM, req(guided_regex="a"), ("guided_regex", "guided_regex")),
        ("vllm-unknown-serial", UNKNOWN_VLLM, req(**tools, parallel_tool_calls=False),
         ("parallel_tool_calls", "parallel_tool_calls=false")),
        ("vllm-unknown-required", UNKNOWN_VLLM, req(**tools, tool_choice="required"),
         ("tool_choice", "tool_choice=required")),
        ("vllm-unknown-effort", UNKNOWN_VLLM, req(reasoning_effort="high"), ("reasoning_effort", "reasoning_effort")),
        ("vllm-unknown-json", UNKNOWN_VLLM, req(response_format={"type": "json_object"}, max_completion_tokens=3),
         None),
        ("vllm-unknown-token-ids", UNKNOWN_VLLM, req(return_token_ids=True), ("return_token_ids", "return_token_ids")),
        ("vllm-unknown-allowed", UNKNOWN_VLLM, req(allowed_token_ids=[1]), ("allowed_token_ids", "allowed_token_ids")),
        ("vllm-unknown-prompt-logprobs", UNKNOWN_VLLM, req(prompt_logprobs=1), None),
    ]  # fmt: skip


CASES = _cases()


@pytest.mark.parametrize(("table", "request_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refusal(table: ChatCapabilities, request_: ChatCompletionRequest, expected: tuple[str, str] | None) -> None:
    assert refusal(table, request_) == expected


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        (vllm(0, 8, 2), "tool_choice=required", "0.8.3"),
        (vllm(0, 33), "tool_choice=auto", "tool_parser"),
        (vllm(0, 14), "tool_choice=function", "tool_parser"),
        (UNKNOWN_VLLM, "reasoning_effort", "unknown"),
        (vllm(0, 33), "store", "OpenAI-only"),
        (OLLAMA_CHAT, "messages=remote_image_url", "data: URL"),
        (TGI_CHAT, "presence_penalty", "repetition_penalty"),
        (vllm(0, 9, 0), "allowed_token_ids", "0.9.2"),
        (vllm(0, 10, 1), "return_token_ids", "0.11"),
    ],
)
def test_refusals_carry_a_reason(table: ChatCapabilities, key: str, words: str) -> None:
    assert words in table.reasons[key]


def test_vllm_levels_by_version() -> None:
    old, new = vllm(0, 6, 3), vllm(0, 33)
    assert old.level("max_completion_tokens") is Level.TRANSLATED  # sent as max_tokens
    assert new.level("max_completion_tokens") is Level.NATIVE
    assert vllm(0, 10).level("guided_json") is Level.NATIVE
    assert vllm(0, 11).level("guided_json") is Level.TRANSLATED  # as structured_outputs
    assert new.level("n") is Level.EMULATED and old.level("n") is Level.NATIVE  # greedy n from 0.12
    assert new.level("tool_choice", "required") is Level.UNSUPPORTED  # no parser from 0.14
    assert new.level("tool_choice", "none") is Level.NATIVE
    assert vllm_chat_capabilities(VLLMChatFeatures.of(VLLMVersion(0, 33, 0), "hermes")) is vllm(0, 33, parser="hermes")


def test_extras_and_openai_only_fields_partition() -> None:
    assert OPENAI_ONLY_FIELDS <= set(CHAT_FIELDS) and VLLM_CHAT_EXTRAS <= set(CHAT_FIELDS)
    assert not OPENAI_ONLY_FIELDS & VLLM_CHAT_EXTRAS
    assert {"echo", "request_id", "structured_outputs", "top_k"} <= VLLM_CHAT_EXTRAS
    assert "user" not in VLLM_CHAT_EXTRAS


# --- a function tool's strict: true on the native servers ----------------------------------------

STRICT = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}


@pytest.mark.parametrize(
    ("table", "level", "expected"),
    [
        (TGI_CHAT, Level.NATIVE, None),  # its tool grammar holds the arguments to the schema
        (OLLAMA_CHAT, Level.UNSUPPORTED, ("tools", "tools=strict")),  # nothing does
        (LLAMACPP_CHAT, Level.NATIVE, None),  # its lazy tool grammar follows the parameters
    ],
)
def test_native_servers_honour_or_refuse_a_strict_tool(
    table: ChatCapabilities, level: Level, expected: tuple[str, str] | None
) -> None:
    assert table.level("tools", "strict") is level
    assert refusal(table, req(tools=[STRICT])) == expected
    assert refusal(table, req(tools=[FN])) is None  # strict is the only thing asked beyond tools
    if expected is None:
        assert table.note("tools", "strict"), "an honoured strict says how (the matrix footnotes it)"
    else:
        assert table.note("tools", "strict") is None and "parses calls" in table.reasons["tools=strict"]


def test_form_notes_are_kept_apart_from_field_notes() -> None:
    table = ChatCapabilities.build(Level.NATIVE, {}, notes={"user": "audited", "tools=strict": "by a grammar"})
    assert (table.note("user"), table.note("tools", "strict"), table.note("tools")) == ("audited", "by a grammar", None)
    with pytest.raises(ValueError, match="tool"):
        ChatCapabilities.build(Level.NATIVE, {}, notes={"tool=strict": "typo"})


def test_a_passed_request_is_checked_again_by_another_table_or_as_a_changed_copy() -> None:
    """A table that passed a request passes it again without a walk (the send-time check after the
    router's), but only that table and only that request: another table (another vLLM version, a
    failover) checks it in full, and so does a copy with changed fields."""
    new, old = vllm(0, 33, parser="hermes"), vllm(0, 8, 0)
    request = req(tools=[FN], tool_choice="required", stream=True, stream_options={"include_usage": True})
    assert new.first_refusal(request) is None
    assert new.first_refusal(request) is None  # again: the same answer
    assert refusal(old, request) == ("tool_choice", "tool_choice=required")  # required from 0.8.3
    assert new.first_refusal(request) is None
    assert refusal(old, request) == ("tool_choice", "tool_choice=required")  # never vouched for by new's pass
    changed = request.model_copy(update={"store": True})  # the private slot is copied with it
    assert refusal(new, changed) == ("store", "store")
    assert request.stream_options is not None
    obfuscated = request.model_copy(
        update={"stream_options": request.stream_options.model_copy(update={"include_obfuscation": True})}
    )
    assert refusal(new, obfuscated) == ("stream_options", "stream_options=include_obfuscation")
