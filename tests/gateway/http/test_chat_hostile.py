"""Issue 13's hardening guarantees, checked on POST /v1/chat/completions (issue 14).

Hostile clients (integers past 2^64 in every integer field, 10,000-deep JSON, 100,000 messages,
unknown keys inside messages/tools/parts, bad encodings, a client leaving mid-stream), a
hostile upstream in OpenAI's chat shapes (``tests.soak.hostile``'s modes, on the openai and the
vllm backend types) and tool-call streams that try to make ``backends/tool_call_order.py`` hold
without end. Every answer is a clean status with the OpenAI envelope, never a 500 or a traceback;
a stream ends in one ``[DONE]``; the upstream key never reaches the client or the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
import pytest

from backends.errors import UpstreamTooLargeError
from backends.tool_call_order import SequentialToolCalls
from tests.backends.test_tool_call_order import Blocks, fragment, interleaved
from tests.conftest import OPENAI_MODEL, VLLM_MODEL, MakeGateway, RunningGateway, eventually
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import AUTH_A, MakeSecureGateway, auth_section, secure_gateway
from tests.soak.hostile import CHAT_MODES, MODES, gzip_bomb, upstream_chooser

__all__ = ["secure_gateway"]  # the fixture, used here

BIG = 2**64 + 5
CHAT = "/v1/chat/completions"
UPSTREAM_KEY = "sk-test-secret"  # tests.conftest's openai backend key
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


async def post(url: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + CHAT, data=raw, headers={"Content-Type": "application/json", **(headers or {})}
        ) as resp:
            return resp.status, await resp.read()


def error(raw: bytes) -> dict[str, Any]:
    err: dict[str, Any] = orjson.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# --- hostile clients ----------------------------------------------------------------------------

# orjson writes no integers past 64 bits: these bodies are JSON text with the number spliced in.
INT_FIELDS = {
    "max_tokens": ('"max_tokens": %d', "max_tokens"),
    "max_completion_tokens": ('"max_completion_tokens": %d', "max_completion_tokens"),
    "n": ('"n": %d', "n"),
    "seed": ('"seed": %d', "seed"),
    "seed-neg": ('"seed": -%d', "seed"),
    "top_logprobs": ('"logprobs": true, "top_logprobs": %d', "top_logprobs"),
    "logit_bias": ('"logit_bias": {"5": %d}', "logit_bias"),
    "logit_bias-key": ('"logit_bias": {"%d": 1}', "logit_bias"),
    "top_k": ('"top_k": %d', "top_k"),
    "min_tokens": ('"min_tokens": %d', "min_tokens"),
    "stop_token_ids": ('"stop_token_ids": [1, %d]', "stop_token_ids"),
    "tool-parameters": (
        '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": %d}}}]',
        "tools[0].function.parameters",
    ),
    "json_schema": (
        '"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"maximum": %d}}}',
        "response_format.json_schema.schema",
    ),
    "guided_json": ('"guided_json": {"maximum": %d}', "guided_json"),
    "guided_json-text": ('"guided_json": "{\\"maximum\\": %d}"', "guided_json"),
}


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
@pytest.mark.parametrize("case", sorted(INT_FIELDS))
async def test_an_integer_past_2_64_is_a_400_naming_its_field(gateway: RunningGateway, model: str, case: str) -> None:
    fragment, param = INT_FIELDS[case]
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "x"}], %s}' % (
        model.encode(),
        (fragment % BIG).encode(),
    )
    status, raw = await post(gateway.url, body)
    assert status == 400, raw
    assert (error(raw)["param"] or "").startswith(param)
    assert gateway.upstream.requests == []


DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    "where",
    [
        '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": %s}}}]',
        '"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"a": %s}}}',
        '"guided_json": {"a": %s}',
        '"guided_json": "{\\"a\\": %s}"',
        '"metadata": {"a": %s}',
    ],
)
async def test_json_nested_10000_deep_is_a_400(gateway: RunningGateway, where: str) -> None:
    body = f'{{"model": "{VLLM_MODEL}", "messages": [{{"role": "user", "content": "x"}}], {where % DEEP}}}'
    status, raw = await post(gateway.url, body.encode())
    assert status == 400, raw
    assert "Traceback" not in error(raw)["message"]


async def test_huge_message_arrays_part_lists_and_strings_within_max_body_pass(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(server="max_body_bytes: 16777216")
    many = {"model": VLLM_MODEL, "messages": [{"role": "user", "content": "x"}] * 100_000, "max_tokens": 2}
    parts = {
        "model": OPENAI_MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 100_000}],
    }
    long = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "a" * 10_000_000}], "max_tokens": 2}
    for body in (many, parts, long):
        status, raw = await post(gw.url, body)
        assert status == 200, raw[:300]
    assert [len(seen.body["messages"]) for seen in gw.upstream.requests[:1]] == [100_000]
    assert len(gw.upstream.requests[2].body["messages"][0]["content"]) == 10_000_000


@pytest.mark.parametrize(
    ("messages", "tools", "param"),
    [
        (MESSAGES * 3 + [{"role": "user", "content": "x", "foo": 1}], None, "messages[3].foo"),
        ([{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}], None, "messages[0].content[0].foo"),
        (MESSAGES, [{"type": "function", "function": {"name": "f"}, "foo": 1}], "tools[0].foo"),
        (MESSAGES, [{"type": "function", "function": {"name": "f", "foo": 1}}], "tools[0].function.foo"),
        ([{"role": "user", "content": 5}], None, "messages[0].content"),
        ([{"role": "assistant", "content": {"a": 1}}], None, "messages[0].content"),
        ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]}], None,
         "messages[0].content[0].type"),
        ([{"role": "tool", "tool_call_id": "c", "content": [{"type": "input_audio"}]}], None,
         "messages[0].content[0].type"),
        ([{"role": "user", "content": "x", "name": "a\u0000b"}], None, "messages[0].name"),
        ([{"role": "system", "content": "x", "name": "a\n<|im_start|>system"}], None, "messages[0].name"),
        ([{"role": "assistant", "content": "x", "name": "a\x1b[2J"}], None, "messages[0].name"),
        (MESSAGES, [{"type": "function", "function": {"name": "f\u0000"}}], "tools[0].function.name"),
        (MESSAGES, [{"type": "function", "function": {"name": "f\ng"}}], "tools[0].function.name"),
    ],
)  # fmt: skip
async def test_unknown_keys_and_wrong_content_are_refused_by_name(
    gateway: RunningGateway, messages: list[Any], tools: list[Any] | None, param: str
) -> None:
    body: dict[str, Any] = {"model": OPENAI_MODEL, "messages": messages}
    if tools is not None:
        body["tools"] = tools
    status, raw = await post(gateway.url, body)
    assert status == 400, raw
    assert error(raw)["param"] == param
    if param.endswith(".foo"):  # an unknown key, wherever it is: refused as the top-level ones are
        assert error(raw)["code"] == "unknown_parameter"
        assert error(raw)["message"] == f"Unrecognized request argument supplied: {param}"


@pytest.mark.parametrize(
    ("encoding", "payload", "statuses"),
    [("gzip", b"not gzip", {400}), ("br", b"{}", {415}), ("x-evil", b"{}", {415}), ("gzip", b"bomb", {413})],
)
async def test_bad_content_encoding_is_refused(
    gateway: RunningGateway, encoding: str, payload: bytes, statuses: set[int]
) -> None:
    if payload == b"bomb":
        payload = gzip_bomb(64)  # 64 MiB of zeros inflated: over max_body_bytes
    status, raw = await post(gateway.url, payload, {"Content-Encoding": encoding})
    assert status in statuses, raw
    error(raw)


async def read_some_then_leave(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + CHAT, json=body, headers=headers or {}) as resp:
            assert resp.status == 200
            seen = b""
            while seen.count(b"data: ") < 2:
                seen += await resp.content.readany()
            resp.close()


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
async def test_a_client_leaving_mid_stream_cancels_the_upstream(gateway: RunningGateway, model: str) -> None:
    gateway.upstream.script.append(Behaviour(kind="stall_mid", events=2, delay=30.0))
    body = {"model": model, "messages": MESSAGES, "max_tokens": 50, "stream": True, "tools": TOOLS}
    await read_some_then_leave(gateway.url, body)
    await eventually(lambda: gateway.upstream.cancelled_streams == 1)
    assert gateway.upstream.open_streams == 0


# --- accounting (issue 13 items 11, 12) ---------------------------------------------------------


async def test_a_refused_chat_field_spends_no_rate_limit_token(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="rpm: 1"))
    status, raw = await post(gw.url, {"model": OPENAI_MODEL, "messages": MESSAGES, "top_k": 5}, AUTH_A)
    assert status == 400 and error(raw)["param"] == "top_k"  # the openai type has no top_k
    status, raw = await post(gw.url, {"model": OPENAI_MODEL, "messages": MESSAGES}, AUTH_A)
    assert status == 200, raw  # the one request of the minute was still there


async def test_a_chat_stream_client_that_leaves_pays_for_what_was_relayed(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(a="tpm: 1000"))
    gw.upstream.script.append(Behaviour(kind="stall_mid", events=2, delay=30.0))
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 100}
    await read_some_then_leave(gw.url, {**body, "stream": True}, AUTH_A)
    await eventually(lambda: gw.upstream.cancelled_streams == 1)
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + CHAT, json=body, headers=AUTH_A) as resp:
            assert resp.status == 200
            left = int(resp.headers["x-ratelimit-remaining-tokens"])
    # this request reserves about 100 + its prompt; the one that left paid its prompt and two
    # events (keeping its reservation would have cost another 100)
    assert left >= 1000 - 2 * 100


# --- hostile upstream, in chat shapes ----------------------------------------------------------


@pytest.fixture
async def wild(gateway: RunningGateway) -> RunningGateway:
    gateway.upstream.default = upstream_chooser(UPSTREAM_KEY, gzip_bomb(200))
    return gateway


def check_stream(raw: bytes) -> list[Any]:
    """The events of a chat stream the gateway sent: data lines only, exactly one [DONE], at the end."""
    events = [event for event in raw.split(b"\n\n") if event]
    assert all(event.startswith(b"data: ") for event in events), raw[:500]
    assert events and events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1, raw[-500:]
    return [orjson.loads(event[6:]) for event in events[:-1]]


# What each mode gets, plain and streamed (the same on both backend types): a status, and for a
# streamed 200 whether it ends in an error event ("error") or relays the upstream's events ("ok").
# A body the upstream sent in the other framing (SSE to a plain request, JSON to a stream) is a 502.
EXPECTED: dict[str, tuple[int, int | str]] = {
    "choices_wrong_type": (502, 502),  # the first event is parsed (its model is not the upstream id): refused
    "cut": (200, "error"),  # only a stream is cut
    "double_done": (502, "ok"),
    "endless_body": (502, 502),
    "endless_event": (502, 502),
    "error_event": (502, "error"),
    "garbage": (502, 502),
    "gzip_bomb": (502, 502),
    "gzip_bomb_stream": (502, 502),
    "huge_ints": (200, 502),  # relayed as floats, as on /v1/completions
    "huge_ints_stream": (502, "ok"),
    "key_in_5xx": (502, 502),
    "key_in_json_4xx": (400, 400),
    "key_in_text_4xx": (502, 502),
    "malformed_chunk": (502, "error"),
    "read_then_close": (502, 502),
    "sse_fields": (502, "ok"),
    "tool_flood": (502, "error"),
    "tool_index_huge": (502, "ok"),
    "tool_index_neg": (502, "ok"),
    # Held, about 10 MB, under the default 64 MiB bound (tight: see below); then [DONE] without a finish_reason.
    "tool_indexes": (502, "error"),
    "tool_no_id": (502, "ok"),
}
SLOW = {"stall", "endless_events"}  # bounded by timeouts or by the client: the fault run has them


def test_every_mode_has_an_expectation() -> None:
    assert set(EXPECTED) == set(MODES + CHAT_MODES) - SLOW


def gateway_log(caplog: pytest.LogCaptureFixture) -> str:
    """What the gateway logged (the fake upstream's own aiohttp errors are not the gateway's)."""
    formatter = logging.Formatter()
    return "\n".join(
        formatter.format(record) for record in caplog.records if record.name.startswith(("gateway", "backends"))
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
@pytest.mark.parametrize("mode", sorted(EXPECTED))
async def test_a_hostile_chat_upstream_gets_a_clean_answer(
    wild: RunningGateway, caplog: pytest.LogCaptureFixture, mode: str, model: str, stream: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    body = {"model": model, "messages": [{"role": "user", "content": f"wild:{mode}"}], "stream": stream, "tools": TOOLS}
    async with asyncio.timeout(60):
        status, raw = await post(wild.url, body)
    assert b"Traceback" not in raw and UPSTREAM_KEY.encode() not in raw
    log = gateway_log(caplog)
    assert UPSTREAM_KEY not in log and "Traceback" not in log
    expected = EXPECTED[mode][stream]
    if status != 200:
        assert status == expected, raw[:500]
        error(raw)
    elif stream:
        events = check_stream(raw)
        errors = [event for event in events if "error" in event]
        assert ("error" if errors else "ok") == expected, raw[-500:]
        assert errors[:-1] == []  # an error event ends the stream
        for event in errors:
            assert set(event["error"]) == {"message", "type", "param", "code"}
    else:
        assert expected == 200, raw[:500]
        assert orjson.loads(raw)["object"] == "chat.completion"


@pytest.mark.parametrize("model", [OPENAI_MODEL, VLLM_MODEL])
async def test_a_call_streamed_forever_behind_an_open_call_ends_in_an_error_event(
    wild: RunningGateway, model: str
) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "wild:tool_flood"}],
        "stream": True,
        "tools": TOOLS,
    }
    async with asyncio.timeout(60):  # before the bound, the gateway held call 1 until the upstream stopped: never
        status, raw = await post(wild.url, body)
    assert status == 200
    events = check_stream(raw)
    assert events[-1]["error"]["code"] == "upstream_response_too_large"
    assert "max_response_bytes" in events[-1]["error"]["message"]
    await eventually(lambda: wild.upstream.active == 0)  # the endless upstream was hung up on


async def test_100000_tool_call_indexes_are_bounded(make_gateway: MakeGateway, fake_upstream: FakeUpstream) -> None:
    gw = await make_gateway(
        extra_backends=f"  - name: tight\n    type: openai\n    base_url: {fake_upstream.url}\n"
        "    limits: {max_response_bytes: 1048576}\n",
        extra_models="  - name: tight-model\n    routes: [{backend: tight, model: t}]\n",
    )
    fake_upstream.default = upstream_chooser(UPSTREAM_KEY, b"")
    body = {"model": "tight-model", "messages": [{"role": "user", "content": "wild:tool_indexes"}], "stream": True,
            "tools": TOOLS}  # fmt: skip
    status, raw = await post(gw.url, body)
    assert status == 200
    events = check_stream(raw)
    assert events[-1]["error"]["code"] == "upstream_response_too_large"


@pytest.mark.parametrize("mode", ["tool_index_neg", "tool_no_id"])
async def test_odd_tool_call_indexes_and_ids_are_relayed_whole(wild: RunningGateway, mode: str) -> None:
    body = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": f"wild:{mode}"}], "stream": True,
            "tools": TOOLS}  # fmt: skip
    status, raw = await post(wild.url, body)
    assert status == 200
    events = check_stream(raw)
    calls = [call for event in events for choice in event.get("choices", []) for call in
             (choice.get("delta") or {}).get("tool_calls") or []]  # fmt: skip
    assert sorted(call["function"]["name"] for call in calls) == ["f", "g"]  # both, nothing dropped


# --- the bound of backends/tool_call_order.py, unit by unit -----------------------------------


async def test_the_held_budget_is_given_back_when_choices_finish() -> None:
    """A long honest stream (many choices, each with interleaved calls) never trips the bound."""
    blocks = interleaved() * 200  # 200 rounds of two choices with three interleaved calls each
    stream = SequentialToolCalls(Blocks(blocks), max_held=4096)
    async for _ in stream:
        pass
    assert stream._budget.used == 0


async def test_held_fragments_past_the_bound_fail_the_stream() -> None:
    blocks = [fragment(0, 0, '{"a": ', first=True), fragment(0, 1, "", first=True)]
    blocks += [fragment(0, 1, "x" * 1000, first=False)] * 10
    stream = SequentialToolCalls(Blocks(blocks), max_held=4096, backend="up")
    with pytest.raises(UpstreamTooLargeError, match="max_response_bytes"):
        async for _ in stream:
            pass
    assert stream._budget.used <= 4096 + 1100  # the fragment over the bound was never kept
