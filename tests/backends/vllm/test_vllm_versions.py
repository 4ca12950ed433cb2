"""Version parsing, per-version capability tables, and version detection in ``VLLMBackend``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import UpstreamCall
from backends.capabilities import Level
from backends.errors import UpstreamConnectError
from backends.vllm.adapter import VLLMBackend
from backends.vllm.capabilities import capabilities_for
from backends.vllm.versions import VLLMFeatures, VLLMVersion, parse_version
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig

URL = "http://vllm.ver:8000/v1"
VERSION_URL = "http://vllm.ver:8000/version"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.32.0", (0, 32, 0)),
        ("0.6.3.post1", (0, 6, 3)),
        ("0.10.1.1", (0, 10, 1)),
        ("0.11.1rc2.dev5+gabc123", (0, 11, 1)),
        ("v0.12", (0, 12, 0)),
        ("1.0", (1, 0, 0)),
        ("dev", None),
        ("", None),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == (VLLMVersion(*expected) if expected else None)


# (version, guided_json level, best_of, n, guided_decoding_backend, guided_whitespace_pattern, early_stopping)
TABLE = [
    ("0.6.3", "native", "native", "native", "native", "native", "unsupported"),
    ("0.8.5", "native", "native", "native", "native", "unsupported", "unsupported"),
    ("0.10.1", "native", "emulated", "native", "native", "unsupported", "unsupported"),
    ("0.11.0", "translated", "emulated", "native", "unsupported", "unsupported", "unsupported"),
    ("0.12.0", "translated", "emulated", "emulated", "unsupported", "unsupported", "unsupported"),
    ("0.32.0", "translated", "emulated", "emulated", "unsupported", "unsupported", "unsupported"),
    (None, "unsupported", "emulated", "emulated", "unsupported", "unsupported", "unsupported"),
]


@pytest.mark.parametrize("row", TABLE, ids=lambda row: str(row[0]))
def test_capability_table_by_version(row: tuple[Any, ...]) -> None:
    version, guided, best_of, n, backend, whitespace, early = row
    table = capabilities_for(VLLMFeatures.of(parse_version(version) if version else None))
    got = [table.level(f).value for f in ("guided_json", "best_of", "n", "guided_decoding_backend")]
    got += [table.level(f).value for f in ("guided_whitespace_pattern", "early_stopping")]
    assert got == [guided, best_of, n, backend, whitespace, early]
    for field in ("guided_regex", "guided_choice", "guided_grammar"):
        assert table.level(field).value == guided
    # Fields vLLM kept everywhere stay native.
    assert table.level("use_beam_search") is Level.NATIVE and table.level("length_penalty") is Level.NATIVE
    # Every refused field says why.
    assert set(table.reasons) == table.unsupported


def test_tables_are_computed_once_per_version() -> None:
    a = capabilities_for(VLLMFeatures.of(VLLMVersion(0, 32, 0)))
    b = capabilities_for(VLLMFeatures.of(VLLMVersion(0, 32, 0)))
    assert a is b


def test_overrides_keep_reasons_of_fields_still_refused() -> None:
    table = capabilities_for(VLLMFeatures.of(VLLMVersion(0, 32, 0)))
    overridden = table.with_overrides({"early_stopping": "native"})
    assert overridden.level("early_stopping") is Level.NATIVE and overridden.reason("early_stopping") is None
    assert overridden.reason("guided_decoding_backend") == table.reason("guided_decoding_backend")


# --- detection ------------------------------------------------------------------------------


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def make(**extra: Any) -> VLLMBackend:
    config = VLLMBackendConfig.model_validate(
        {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx", **extra}
    )
    return VLLMBackend(config)


def answer(fingerprint: str | None = None, text: str = " ok") -> httpx.Response:
    body: dict[str, Any] = {
        "id": "c",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    if fingerprint:
        body["system_fingerprint"] = fingerprint
    return httpx.Response(200, json=body)


def call(**fields: Any) -> UpstreamCall:
    return UpstreamCall(CompletionRequest.model_validate({"model": "p", "prompt": "x", **fields}), "m", "p", "r")


async def test_start_detects_the_version(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    backend = make(version="0.10.1")  # the pin only stands in when /version does not answer
    assert backend.version == VLLMVersion(0, 10, 1) and backend.version_source == "pinned"
    await backend.start()
    assert backend.version == VLLMVersion(0, 32, 0) and backend.version_source == "detected"
    assert backend.capabilities.level("guided_json") is Level.TRANSLATED
    await backend.close()


async def test_pin_is_used_when_version_endpoint_is_missing(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    backend = make(version="0.11.0")
    await backend.start()
    assert backend.version == VLLMVersion(0, 11, 0) and backend.version_source == "pinned"
    await backend.close()


async def test_unknown_version_refuses_constraints(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(404))
    backend = make()
    await backend.start()
    assert backend.version is None and backend.capabilities.level("guided_regex") is Level.UNSUPPORTED
    reason = backend.capabilities.reason("guided_regex")
    assert reason is not None and "version is unknown" in reason
    await backend.close()


async def test_reconnect_rereads_the_version(mock: respx.MockRouter) -> None:
    version = mock.get(VERSION_URL)
    version.side_effect = [
        httpx.Response(200, json={"version": "0.10.1"}),
        httpx.Response(200, json={"version": "0.32.0"}),
    ]
    completions = mock.post(URL + "/completions")
    completions.side_effect = [httpx.ConnectError("refused"), answer()]
    backend = make()
    await backend.start()
    assert backend.version == VLLMVersion(0, 10, 1)
    with pytest.raises(UpstreamConnectError):
        await backend.complete(call(guided_regex="a+"))
    backend._last_attempt = -10.0  # no waiting out the retry interval in a test
    await backend.complete(call(guided_regex="a+"))
    assert backend.version == VLLMVersion(0, 32, 0)
    # The request after the reconnect went in the new version's form.
    assert orjson.loads(completions.calls.last.request.content)["structured_outputs"] == {"regex": "a+"}
    await backend.close()


async def test_start_survives_an_unreachable_server(mock: respx.MockRouter) -> None:
    version = mock.get(VERSION_URL)
    version.side_effect = [httpx.ConnectError("down"), httpx.Response(200, json={"version": "0.32.0"})]
    mock.post(URL + "/completions").mock(return_value=answer())
    backend = make()
    await backend.start()
    assert backend.version is None
    backend._last_attempt = -10.0
    await backend.complete(call())
    assert backend.version == VLLMVersion(0, 32, 0)
    await backend.close()


async def test_constraint_answered_by_another_version_is_resent_in_its_form(mock: respx.MockRouter) -> None:
    """Upgraded behind a kept-alive connection: the fingerprint shows it, the answer is not used."""
    version = mock.get(VERSION_URL)
    version.side_effect = [
        httpx.Response(200, json={"version": "0.10.1"}),
        httpx.Response(200, json={"version": "0.32.0"}),
    ]
    completions = mock.post(URL + "/completions")
    completions.side_effect = [
        answer("vllm-0.32.0-abc", text="unconstrained"),
        answer("vllm-0.32.0-abc", text="aaa"),
    ]
    backend = make()
    await backend.start()
    result = await backend.complete(call(guided_regex="a+"))
    assert orjson.loads(result.body)["choices"][0]["text"] == "aaa"
    first, second = (orjson.loads(c.request.content) for c in completions.calls)
    assert first["guided_regex"] == "a+" and second["structured_outputs"] == {"regex": "a+"}
    await backend.close()


async def test_streamed_constraint_on_an_old_version_reconfirms_it_first(mock: respx.MockRouter) -> None:
    version = mock.get(VERSION_URL)
    version.side_effect = [
        httpx.Response(200, json={"version": "0.10.1"}),
        httpx.Response(200, json={"version": "0.32.0"}),
    ]
    sse = b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[]}\n\ndata: [DONE]\n\n'
    completions = mock.post(URL + "/completions").mock(
        return_value=httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
    )
    backend = make()
    await backend.start()
    backend._confirmed_at = -10.0  # the last confirmation is old
    stream = await backend.stream(call(guided_choice=["a", "b"], stream=True))
    await stream.aclose()
    assert orjson.loads(completions.calls.last.request.content)["structured_outputs"] == {"choice": ["a", "b"]}
    await backend.close()


async def test_plain_requests_do_not_reconfirm(mock: respx.MockRouter) -> None:
    version = mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    mock.post(URL + "/completions").mock(return_value=answer("vllm-0.32.0-x"))
    backend = make()
    await backend.start()
    for _ in range(3):
        await backend.complete(call(max_tokens=2))
    assert version.call_count == 1
    await backend.close()


# --- issue 13: current vLLM's fields, per-backend bounds, one refusal constructor ---------------


def _req(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "p", "prompt": "x", **fields})


def _refused(version: VLLMVersion | None, **fields: Any) -> str | None:
    return capabilities_for(VLLMFeatures.of(version)).first_violation(_req(**fields))


V0_10, V0_12, V0_32 = VLLMVersion(0, 10, 1), VLLMVersion(0, 12, 0), VLLMVersion(0, 32, 0)


@pytest.mark.parametrize(
    ("version", "fields", "refused"),
    [
        # logprobs: vLLM's --max-logprobs default (20), not OpenAI's 5
        (V0_32, {"logprobs": 20}, None),
        (V0_32, {"logprobs": 21}, "logprobs"),
        (V0_32, {"prompt_logprobs": 20}, None),
        (V0_32, {"prompt_logprobs": -1}, "prompt_logprobs"),
        # current fields, with their version boundaries
        (V0_32, {"structured_outputs": {"json_object": True}}, None),
        (V0_10, {"structured_outputs": {"regex": "a"}}, None),  # translated to guided_regex
        (V0_10, {"structured_outputs": {"json_object": True}}, "structured_outputs"),
        (None, {"structured_outputs": {"regex": "a"}}, "structured_outputs"),
        (V0_32, {"structured_outputs": {"json": {}, "whitespace_pattern": " "}}, "structured_outputs"),
        (V0_32, {"return_token_ids": True}, None),
        (V0_10, {"return_token_ids": True}, "return_token_ids"),
        (None, {"return_token_ids": True}, "return_token_ids"),
        (V0_32, {"truncation_side": "left", "truncate_prompt_tokens": 4}, None),
        (V0_12, {"truncation_side": "left"}, "truncation_side"),
        (V0_10, {"truncate_prompt_tokens": 4, "allowed_token_ids": [1]}, None),
        (V0_32, {"return_tokens_as_token_ids": True}, None),
        (None, {"return_tokens_as_token_ids": True}, "return_tokens_as_token_ids"),
        # early_stopping "never" is a value the capability check decides on (vLLM ignores it)
        (V0_32, {"early_stopping": "never"}, "early_stopping"),
        (VLLMVersion(0, 5, 0), {"early_stopping": "never"}, None),
        # an empty or null prompt: vLLM refuses "must be provided and non-empty"
        (V0_32, {"prompt": ""}, "prompt"),
        (V0_32, {"prompt": None}, "prompt"),
        (V0_32, {"prompt": [[1]]}, None),
        # the nested vLLM extra is native here
        (V0_32, {"stream": True, "stream_options": {"continuous_usage_stats": True}}, None),
    ],
)
def test_current_vllm_fields(version: VLLMVersion | None, fields: dict[str, Any], refused: str | None) -> None:
    assert _refused(version, **fields) == refused


def test_openai_type_refuses_vllm_only_nested_field_and_keeps_openai_bounds() -> None:
    from backends.openai.capabilities import OPENAI_CAPABILITIES

    request = _req(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    error = OPENAI_CAPABILITIES.refusal(request, "up", "openai")
    assert error is not None and error.param == "stream_options.continuous_usage_stats"
    assert (
        OPENAI_CAPABILITIES.first_violation(_req(stream=True, stream_options={"continuous_usage_stats": False})) is None
    )
    assert OPENAI_CAPABILITIES.first_violation(_req(logprobs=5)) is None
    assert OPENAI_CAPABILITIES.first_violation(_req(logprobs=6)) == "logprobs"
    for name in ("structured_outputs", "prompt_logprobs", "return_token_ids", "truncation_side"):
        assert OPENAI_CAPABILITIES.level(name) is Level.UNSUPPORTED


def test_openai_payload_drops_neutral_nested_extra() -> None:
    from backends.openai.adapter import OpenAIBackend
    from schemas.config import OpenAIBackendConfig

    config = OpenAIBackendConfig.model_validate({"type": "openai", "name": "o", "base_url": "http://o/v1"})
    backend = OpenAIBackend(config)
    fields = backend._wire.completion_fields(
        UpstreamCall(
            _req(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": False}), "m", "p", "r"
        ),
        backend.capabilities,
    )
    assert fields["stream_options"] == {"include_usage": True}


async def test_structured_outputs_goes_as_guided_before_0_11(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.10.1"}))
    route = mock.post(URL + "/completions").mock(return_value=answer("vllm-0.10.1"))
    backend = make()
    await backend.start()
    await backend.complete(call(structured_outputs={"choice": ["a", "b"]}))
    sent = orjson.loads(route.calls[0].request.content)
    assert sent["guided_choice"] == ["a", "b"] and "structured_outputs" not in sent
    await backend.close()


async def test_refusal_at_send_time_names_the_field(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.12.0"}))
    route = mock.post(URL + "/completions").mock(return_value=answer())
    backend = make()
    await backend.start()
    from schemas.errors import UnsupportedParameterError

    with pytest.raises(UnsupportedParameterError) as caught:
        await backend.complete(call(structured_outputs={"regex": "a"}, best_of=2, truncation_side="left"))
    assert caught.value.param == "truncation_side" and "vLLM 0.12.0" in caught.value.message
    assert not route.called
    await backend.close()


async def test_vllm_extras_are_dropped_from_answers_unless_asked(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    body = orjson.loads(answer().content)
    body["choices"][0] |= {"token_ids": [5], "prompt_token_ids": [1], "prompt_logprobs": None}
    mock.post(URL + "/completions").mock(return_value=httpx.Response(200, json=body))
    backend = make()
    await backend.start()
    plain = orjson.loads((await backend.complete(call())).body)["choices"][0]
    asked = orjson.loads((await backend.complete(call(return_token_ids=True))).body)["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain
    assert asked["token_ids"] == [5] and asked["prompt_token_ids"] == [1] and "prompt_logprobs" not in asked
    await backend.close()


async def test_start_reads_each_models_context_window(mock: respx.MockRouter) -> None:
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    models = [{"id": "m", "object": "model", "max_model_len": 4096}, {"id": "odd", "max_model_len": "big"}]
    mock.get(URL + "/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": models}))
    backend = make()
    assert backend.context_length("m") is None  # unknown until the server said
    await backend.start()
    assert backend.context_length("m") == 4096 and backend.context_length("odd") is None
    assert backend.context_length("other") is None
    await backend.close()
