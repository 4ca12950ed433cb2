"""Nothing silently dropped: every chat field, set to a value that asks for something, on every backend type.

For each field of :class:`~schemas.chat.ChatCompletionRequest` (the table :data:`ASKS` must
cover them all) and each backend type, a request with that field set goes through the gateway
(``tests.e2e.chat_upstreams``). It must either be refused (400 ``unsupported_parameter`` whose
``param`` names the field, or the field it needs alongside, with nothing sent upstream) or
reach the upstream: the value visible in the body the upstream recorded, under its own name or
its native one (:data:`NATIVE_NAMES`), or, for an emulated field, done by the gateway (``n``:
several upstream calls; ``user``: recorded in the request's audit line, on every backend type,
forwarded too where the server has the field). The backend's chat table must agree: unsupported
exactly when refused.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from backends.capabilities import AUDIT_USER_NOTE, Level
from backends.chat_capabilities import CHAT_FIELDS
from backends.mock.capabilities import MOCK_CHAT
from backends.native.llamacpp_capabilities import LLAMACPP_CHAT
from backends.native.ollama_capabilities import OLLAMA_CHAT
from backends.native.tgi_capabilities import TGI_CHAT
from backends.openai.capabilities import OPENAI_CHAT
from backends.vllm.capabilities import vllm_chat_capabilities
from backends.vllm.versions import VLLMChatFeatures, parse_version
from schemas.chat import ChatCompletionRequest
from tests.conftest import eventually
from tests.e2e.chat_upstreams import KINDS, VLLM_VERSION, ChatGateway, model_of, start_chat_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
AUDIO = {"voice": "alloy", "format": "wav"}
# field -> (a value that asks for something, other fields that value needs)
ASKS: dict[str, tuple[Any, dict[str, Any]]] = {
    "modalities": (["text", "audio"], {"audio": AUDIO}),
    "verbosity": ("high", {}),
    "reasoning_effort": ("high", {}),
    "max_completion_tokens": (17, {}),
    "frequency_penalty": (0.37, {}),
    "presence_penalty": (0.41, {}),
    "web_search_options": ({"search_context_size": "low"}, {}),
    "top_logprobs": (3, {"logprobs": True}),
    "response_format": ({"type": "json_schema", "json_schema": {"name": "s77", "schema": {"title": "S77"}}}, {}),
    "audio": (AUDIO, {"modalities": ["text", "audio"]}),
    "store": (True, {}),
    "stream": (True, {}),
    "stop": (["ZZSTOP"], {}),
    "logit_bias": ({"1234": 5}, {}),
    "logprobs": (True, {}),
    "max_tokens": (19, {}),
    "n": (2, {}),
    "prediction": ({"type": "content", "content": "PREDICTED77"}, {}),
    "seed": (4242, {}),
    "service_tier": ("flex", {}),
    "stream_options": ({"include_usage": True}, {"stream": True}),
    "temperature": (0.63, {}),
    "top_p": (0.71, {}),
    "tools": ([TOOL], {}),
    "tool_choice": ("required", {"tools": [TOOL]}),
    "parallel_tool_calls": (False, {"tools": [TOOL]}),
    "user": ("user-77", {}),
    "safety_identifier": ("safety-77", {}),
    "prompt_cache_key": ("cache-77", {}),
    "metadata": ({"k": "meta-77"}, {}),
    "functions": ([{"name": "f77", "parameters": {"type": "object"}}], {}),
    "function_call": ("auto", {"functions": [{"name": "f77", "parameters": {"type": "object"}}]}),
    "echo": (True, {}),
    "add_generation_prompt": (False, {}),
    "continue_final_message": (True, {"add_generation_prompt": False}),
    "add_special_tokens": (True, {}),
    "documents": ([{"title": "doc-77", "text": "x"}], {}),
    "chat_template": ("TEMPLATE-77", {}),
    "chat_template_kwargs": ({"flag77": True}, {}),
    "use_beam_search": (True, {}),
    "top_k": (23, {}),
    "min_p": (0.07, {}),
    "repetition_penalty": (1.13, {}),
    "length_penalty": (1.3, {}),
    "stop_token_ids": ([777], {}),
    "include_stop_str_in_output": (True, {}),
    "ignore_eos": (True, {}),
    "min_tokens": (3, {}),
    "skip_special_tokens": (False, {}),
    "spaces_between_special_tokens": (False, {}),
    "truncate_prompt_tokens": (77, {}),
    "truncation_side": ("left", {}),
    "prompt_logprobs": (2, {}),
    "allowed_token_ids": ([777, 778], {}),
    "bad_words": (["BAD77"], {}),
    "logprob_token_ids": ([771, 772], {"logprobs": True}),
    "include_reasoning": (False, {}),
    "thinking_token_budget": (77, {}),
    "guided_json": ({"title": "G77"}, {}),
    "guided_regex": ("R77[0-9]+", {}),
    "guided_choice": (["yes77", "no77"], {}),
    "guided_grammar": ('root ::= "G77"', {}),
    "guided_decoding_backend": ("xgrammar", {"guided_regex": "R77[0-9]+"}),
    "guided_whitespace_pattern": ("[ ]77", {"guided_json": {"title": "G77"}}),
    "structured_outputs": ({"choice": ["a77", "b77"]}, {}),
    "priority": (5, {}),
    "request_id": ("rid-77", {}),
    "return_tokens_as_token_ids": (True, {"logprobs": True}),
    "return_token_ids": (True, {}),
    "session_id": ("session-77", {}),
    "cache_salt": ("salt-77", {}),
    "kv_transfer_params": ({"kv77": True}, {}),
    "vllm_xargs": ({"xarg77": 77}, {}),
    "repetition_detection": ({"max_pattern_size": 7, "min_count": 3}, {}),
    "stream_interval": (7, {}),
    "media_io_kwargs": ({"video": {"num_frames": 77}}, {}),
    "mm_processor_kwargs": ({"mm77": 77}, {}),
    "watermarking": (True, {}),
    "routed_experts_prompt_start": (77, {}),
    "ec_transfer_params": ({"ec77": True}, {}),
}
# The names a translated field takes upstream, where the backend renames it.
NATIVE_NAMES: dict[str, tuple[str, ...]] = {
    "max_completion_tokens": ("max_tokens", "num_predict"),
    "max_tokens": ("num_predict", "max_completion_tokens"),
    "repetition_penalty": ("repeat_penalty",),
    "logprobs": ("logprobs", "details"),
    "response_format": ("format", "grammar"),
    "reasoning_effort": ("think",),
}
# Where a backend's native form holds the value differently: (type, field) -> what to look for.
NATIVE_VALUES: dict[tuple[str, str], Any] = {
    ("tgi", "response_format"): {"title": "S77"},  # {"type": "json", "value": <the schema>}
    ("llamacpp", "logit_bias"): [[1234, 5.0]],  # llama.cpp's [[token, bias]] pairs
}
# Honoured without sending anything: the server cannot do otherwise.
HONOURED_BY_NATURE: dict[tuple[str, str], str] = {
    ("tgi", "parallel_tool_calls"): "TGI makes at most one tool call: false is what it does anyway",
}
# Honoured by the gateway itself on every backend type: the request's audit line carries the value
# (``gateway.security.audit``); where the server has no such field the table says so in a note.
AUDITED = {"user"}
TABLES = {
    "openai": OPENAI_CHAT,
    "vllm": vllm_chat_capabilities(VLLMChatFeatures.of(parse_version(VLLM_VERSION), "hermes")),
    "tgi": TGI_CHAT,
    "ollama": OLLAMA_CHAT,
    "llamacpp": LLAMACPP_CHAT,
    "mock": MOCK_CHAT,
}
BASE = [{"role": "user", "content": "Hi"}]


class AuditLines(logging.Handler):
    """The audit lines the gateway wrote, by request id."""

    def __init__(self) -> None:
        super().__init__()
        self.by_request: dict[str, dict[str, Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        line = json.loads(record.getMessage())
        self.by_request[line["request_id"]] = line


@pytest.fixture(scope="module")
def audit_lines() -> Iterator[AuditLines]:
    handler = AuditLines()
    logger = logging.getLogger("gateway.audit")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chat_gateway() -> AsyncIterator[ChatGateway]:
    async with start_chat_gateway() as gateway:
        yield gateway


async def test_every_field_has_a_value_that_asks_for_something() -> None:
    assert set(ASKS) == set(CHAT_FIELDS) - {"messages", "model"}


def _leaves_match(node: Any, value: Any) -> bool:
    if node == value and type(node) is type(value):
        return True
    if isinstance(value, str) and isinstance(node, str) and value in node:
        return True
    if isinstance(node, dict):
        return any(_leaves_match(v, value) for v in node.values())
    if isinstance(node, list):
        return any(_leaves_match(v, value) for v in node)
    return False


def _named(node: Any, names: tuple[str, ...]) -> bool:
    """A key of one of ``names`` with a value other than off/empty, anywhere in the body."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in names and value not in (None, False, [], {}, ""):
                return True
            if _named(value, names):
                return True
    if isinstance(node, list):
        return any(_named(v, names) for v in node)
    return False


def reached(sent: list[dict[str, Any]], field: str, value: Any) -> bool:
    if not sent:
        return False
    body = sent[0]
    if isinstance(value, bool):  # a flag is only visible under a name, never as a bare leaf
        return body.get(field) == value or _named(body, NATIVE_NAMES.get(field, ()))
    if _leaves_match(body, value):
        return True
    return _named(body, NATIVE_NAMES.get(field, ()))


CASES = [(kind, field) for kind in KINDS for field in ASKS]


@pytest.mark.parametrize(("kind", "field"), CASES)
async def test_every_field_is_sent_or_refused_by_name(
    chat_gateway: ChatGateway, audit_lines: AuditLines, kind: str, field: str
) -> None:
    chat_gateway.reset()
    value, needs = ASKS[field]
    messages = [*BASE, {"role": "assistant", "content": "Hel"}] if field == "continue_final_message" else BASE
    body = {"model": model_of(kind), "messages": messages, **needs, field: value}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{chat_gateway.url}/v1/chat/completions", json=body) as resp:
            status, raw, request_id = resp.status, await resp.read(), resp.headers["x-request-id"]
    level = TABLES[kind].level(field)
    if status == 400:
        error = json.loads(raw)["error"]
        assert error["code"] == "unsupported_parameter", error
        assert error["param"] in (field, *needs), error
        assert all(not u.requests for u in chat_gateway.upstreams.values()), "refused, yet sent"
        refusal = TABLES[kind].first_refusal(ChatCompletionRequest.model_validate(body))
        assert refusal is not None and refusal.param == error["param"], "refused, but not by the backend's table"
        return
    assert status == 200, raw
    assert level is not Level.UNSUPPORTED, f"{kind} accepted {field} its table marks unsupported"
    if field in AUDITED:
        await eventually(lambda: request_id in audit_lines.by_request)  # written as the request closes
        assert audit_lines.by_request[request_id][field] == value, audit_lines.by_request[request_id]
        if level is Level.EMULATED:  # the audit line is all there is: the table must say so
            assert TABLES[kind].note(field) == AUDIT_USER_NOTE, (kind, field)
            assert not reached(chat_gateway.sent(kind), field, value), "emulated, yet sent upstream"
            return
    if kind == "mock":
        return  # the simulator in-process: its answer is the evidence (tests/backends/test_mock_chat.py)
    sent = chat_gateway.sent(kind)
    if level is Level.EMULATED:
        if field == "n":
            assert len(sent) == value or sent[0].get("n") == value, sent  # fanned out in the gateway
        elif field == "stream_options":
            assert b'"choices":[]' in raw, "no usage chunk although include_usage was asked"
        return
    if (kind, field) in HONOURED_BY_NATURE:
        return
    assert reached(sent, field, NATIVE_VALUES.get((kind, field), value)), (
        f"{kind} answered 200 but {field}={value!r} is not in what it sent: {sent}"
    )


# --- value forms the field table cannot show: a function tool's strict: true --------------------------

STRICT_TOOL = {"type": "function", "function": {**TOOL["function"], "strict": True}}
# What each backend type's upstream gets of a strict tool it honours: the key itself where the server
# reads it (or ignores it harmlessly: llama.cpp), none where the server has no such key (TGI: its grammar
# holds the arguments anyway).
STRICT_SENT = {"openai": True, "vllm": True, "llamacpp": True, "tgi": False}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_strict_tool_is_honoured_or_refused_by_name(chat_gateway: ChatGateway, kind: str) -> None:
    chat_gateway.reset()
    body = {"model": model_of(kind), "messages": BASE, "tools": [STRICT_TOOL]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{chat_gateway.url}/v1/chat/completions", json=body) as resp:
            status, raw = resp.status, await resp.read()
    level = TABLES[kind].level("tools", "strict")
    if level is Level.UNSUPPORTED:
        assert status == 400, raw
        error = json.loads(raw)["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", "tools"), error
        assert "strict" in error["message"], error  # the form is named, not just the field
        assert all(not u.requests for u in chat_gateway.upstreams.values()), "refused, yet sent"
        return
    assert status == 200, raw
    if kind == "mock":
        return  # the simulator's arguments follow the schema (tests/backends/test_mock_chat.py)
    assert kind in STRICT_SENT, f"{kind} took a strict tool no one there enforces"
    (sent,) = chat_gateway.sent(kind)
    (tool,) = sent["tools"]
    assert tool["function"]["parameters"] == TOOL["function"]["parameters"], "the schema the grammar needs"
    assert ("strict" in tool["function"]) is STRICT_SENT[kind], tool
    if not STRICT_SENT[kind]:  # not sent: the table must say how it is honoured all the same
        assert TABLES[kind].note("tools", "strict"), kind
