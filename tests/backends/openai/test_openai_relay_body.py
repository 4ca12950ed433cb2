"""Non-streamed OpenAI-shaped bodies (``relay_completion_body``, ``relay_chat_body``) reach the client as sent.

The promise: the upstream's bytes, with only the top-level model name swapped; where a
byte swap is not provably safe (a nested or escaped ``"model"``, an unexpected spelling)
the body is serialised again, and then integers beyond 64 bits stay integers.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from backends.base import ChatCall, UpstreamCall
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_exact, loads_keeping_integers
from backends.openai.adapter import OpenAIBackend
from backends.openai.body import relay_completion_body
from backends.openai.chat import relay_chat_body
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import OpenAIBackendConfig

UP = "org/up-model"
PUB = "public-model"
BIG = 18446744073709551616  # 2**64: orjson reads it as a float
NEG = -9223372036854775809  # -2**63 - 1: likewise


def completion_call() -> UpstreamCall:
    return UpstreamCall(CompletionRequest(model=PUB, prompt="hi"), UP, PUB, "req-1")


def chat_call() -> ChatCall:
    request = ChatCompletionRequest.model_validate({"model": PUB, "messages": [{"role": "user", "content": "hi"}]})
    return ChatCall(request, UP, PUB, "req-1")


# Spelled as an upstream might: a 2**64+ integer, a float orjson would respell (1e-05 ->
# 0.00001), unicode escapes, a space after colons, and keys in no particular order.
COMPLETION = (
    b'{"id": "cmpl-1", "object": "text_completion", "created": 18446744073709551616, "model": "org/up-model",'
    b' "choices": [{"index": 0, "text": "caf\\u00e9 \\ud83d\\ude00 \\"model\\"", "finish_reason": "length",'
    b' "logprobs": {"tokens": ["a"], "token_logprobs": [-1e-05], "top_logprobs": null, "text_offset": [0]}}],'
    b' "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}, "seed": -9223372036854775809,'
    b' "x_ratio": 1.50}'
)
CHAT = (
    b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"org/up-model","system_fingerprint":"fp_\\u00e9",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hi \\u2603","refusal":null},"logprobs":'
    b'{"content":[{"token":"Hi","logprob":-1e-05,"bytes":[72,105],"top_logprobs":[]}]},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"token_id":18446744073709551617}'
)


def test_completion_body_is_byte_exact_but_for_the_model() -> None:
    result = relay_completion_body(COMPLETION, completion_call(), "oa")
    assert result.body == COMPLETION.replace(b'"model": "org/up-model"', b'"model": "public-model"')
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 1)


def test_chat_body_is_byte_exact_but_for_the_model() -> None:
    result = relay_chat_body(CHAT, chat_call(), "oa")
    assert result.body == CHAT.replace(b'"model":"org/up-model"', b'"model":"public-model"')
    assert result.usage is not None and (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 1)


def test_model_spelled_otherwise_than_the_id_sent_is_swapped_too() -> None:
    data = CHAT.replace(b'"org/up-model"', b'"org/up-model-2025-01-01"')
    result = relay_chat_body(data, chat_call(), "oa")
    assert result.body == CHAT.replace(b'"model":"org/up-model"', b'"model":"public-model"')


def fallback_cases() -> list[Any]:
    nested = CHAT.replace(b'"refusal":null', b'"refusal":null,"tool":{"model":"org/up-model"}')
    as_value = CHAT.replace(b'"refusal":null', b'"refusal":"model"')
    escaped_top = CHAT.replace(b'"model":"org/up-model"', b'"mod\\u0065l":"org/up-model"').replace(
        b'"refusal":null', b'"refusal":null,"model":"org/up-model"'
    )
    return [
        pytest.param(nested, {"tool": {"model": UP}}, id="nested-model-key"),
        pytest.param(as_value, {"refusal": "model"}, id="model-as-a-value"),
        pytest.param(escaped_top, {"model": UP}, id="escaped-top-level-key"),
        pytest.param(CHAT.replace(b'"model":"', b'"model" : "'), {}, id="odd-spacing"),
        pytest.param(CHAT.replace(b'"model":"org/up-model",', b""), {}, id="no-model"),
        pytest.param(CHAT.replace(b'"model":"org/up-model"', b'"model":null'), {}, id="null-model"),
        pytest.param(CHAT.replace(b'"org/up-model"', b'"org\\/up-model"'), {}, id="escaped-model-value"),
    ]


@pytest.mark.parametrize(("data", "inner"), fallback_cases())
def test_bodies_the_byte_swap_cannot_prove_are_serialised_again_exactly(data: bytes, inner: dict[str, Any]) -> None:
    result = relay_chat_body(data, chat_call(), "oa")
    obj = json.loads(result.body)  # the stdlib keeps big integers as integers
    assert obj["model"] == PUB
    assert obj["token_id"] == BIG + 1 and isinstance(obj["token_id"], int)
    message = obj["choices"][0]["message"]
    assert message["content"] == "Hi \u2603"
    for key, value in inner.items():
        assert message.get(key, obj.get(key)) == value  # nested "model" keys are not the top-level one
    assert result.usage is not None and result.usage.prompt_tokens == 3


def test_fallback_keeps_negative_and_positive_big_integers() -> None:
    data = COMPLETION.replace(b'"model": "org/up-model"', b'"model":"org/up-model","extra":{"model":1}')
    obj = json.loads(relay_completion_body(data, completion_call(), "oa").body)
    assert (obj["created"], obj["seed"], obj["model"], obj["extra"]) == (BIG, NEG, PUB, {"model": 1})
    assert obj["choices"][0]["logprobs"]["token_logprobs"] == [-1e-05]


def test_an_integer_beyond_a_float_is_refused_by_the_first_parse() -> None:
    # orjson refuses integers past a double's range (over ~309 digits): a 502 as before.
    data = CHAT.replace(b'"created":1,', b'"created":' + b"9" * 400 + b",")
    with pytest.raises(UpstreamProtocolError, match="not JSON") as info:
        relay_chat_body(data, chat_call(), "oa")
    assert info.value.status == 502


def test_loads_exact_refuses_an_integer_too_long_for_python_with_a_502() -> None:
    with pytest.raises(UpstreamProtocolError, match="integer too long") as info:
        loads_exact(b'{"a":' + b"9" * 5000 + b"}", "oa")
    assert info.value.status == 502
    assert loads_exact(b'{"a":18446744073709551616}', "oa") == {"a": BIG}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a chat.completion"),
        (b'{"choices": {}}', "not a chat.completion"),
        (b'{"model": "org/up-model"}', "not a chat.completion"),
    ],
)
def test_shape_checks_still_refuse(data: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError, match=message):
        relay_chat_body(data, chat_call(), "oa")


def test_dumps_exact_keeps_integers_beyond_64_bits() -> None:
    assert dumps_exact({"a": BIG, "b": "\u00e9"}, "oa") == '{"a":18446744073709551616,"b":"\u00e9"}'.encode()
    assert dumps_exact({"a": 1}, "oa") == b'{"a":1}'


def test_loads_keeping_integers_reads_big_integers_exactly() -> None:
    assert loads_keeping_integers(b'{"a":[18446744073709551616,-9223372036854775809,1e-05]}', "oa") == {
        "a": [BIG, NEG, 1e-05]
    }
    assert loads_keeping_integers(b'{"a":1}', "oa") == {"a": 1}


def nested(depth: int) -> bytes:
    return CHAT.replace(b'"refusal":null', b'"refusal":null,"deep":' + b"[" * depth + b"]" * depth + b',"model":1')


def test_fallback_relays_nesting_deeper_than_orjson_writes() -> None:
    # orjson writes 255 levels; a body with more used to fail with a 500 on the way back.
    obj = json.loads(relay_chat_body(nested(300), chat_call(), "oa").body)
    assert obj["model"] == PUB and obj["token_id"] == BIG + 1


def test_fallback_nesting_past_the_stdlibs_reach_is_a_502() -> None:
    with pytest.raises(UpstreamProtocolError, match="nested too deeply") as info:
        relay_chat_body(nested(1000), chat_call(), "oa")
    assert info.value.status == 502


# --- through the openai backend (httpx transport, respx upstream) --------------------------------


URL = "http://openai.test/v1"


def backend() -> OpenAIBackend:
    data = {"type": "openai", "name": "oa", "base_url": URL, "api_key": "sk-secret", "transport": "httpx"}
    return OpenAIBackend(OpenAIBackendConfig.model_validate(data))


async def test_openai_backend_relays_the_upstreams_bytes() -> None:
    with respx.mock(assert_all_mocked=True) as mock:
        mock.post(f"{URL}/completions").mock(return_value=httpx.Response(200, content=COMPLETION))
        mock.post(f"{URL}/chat/completions").mock(return_value=httpx.Response(200, content=CHAT))
        b = backend()
        completion = await b.complete(completion_call())
        chat = await b.chat(chat_call())
        await b.close()
    assert completion.body == COMPLETION.replace(b'"model": "org/up-model"', b'"model": "public-model"')
    assert chat.body == CHAT.replace(b'"model":"org/up-model"', b'"model":"public-model"')
