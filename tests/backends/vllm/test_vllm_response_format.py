"""vLLM's completions ``response_format`` and ``prompt_embeds`` by version: what the table refuses
and what body each version gets (respx, no server).

The version facts come from vLLM's wheels (0.6.3, 0.7.3, 0.10.1.1, 0.11.0, 0.12.0, 0.32.0): before
0.12 a completions ``response_format`` other than ``json_object`` is validated and ignored (0.11
applies ``json_object`` only inside ``structured_outputs``); ``prompt_embeds`` is there from 0.10.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import UpstreamCall
from backends.capabilities import Level
from backends.errors import UpstreamStatusError
from backends.vllm.adapter import VLLMBackend
from backends.vllm.capabilities import capabilities_for
from backends.vllm.versions import VLLMFeatures, VLLMVersion
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig

URL = "http://vllm.rf:8000/v1"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
NO_SCHEMA = {"type": "json_schema", "json_schema": {"name": "n"}}
TAG = {"type": "structural_tag", "format": {"type": "any_text"}}
V0_6, V0_10_0, V0_10, V0_11, V0_12, V0_32 = (
    VLLMVersion(0, 6, 3), VLLMVersion(0, 10, 0), VLLMVersion(0, 10, 1), VLLMVersion(0, 11, 0), VLLMVersion(0, 12, 0),
    VLLMVersion(0, 32, 0),
)  # fmt: skip


def _req(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "p", "prompt": "x", **fields})


@pytest.mark.parametrize(
    ("version", "fields", "refused"),
    [
        # JSON forms: as sent from 0.12, translated before; refused while the version is unknown
        *[(v, {"response_format": JSON_SCHEMA}, None) for v in (V0_6, V0_10, V0_11, V0_12, V0_32)],
        *[(v, {"response_format": {"type": "json_object"}}, None) for v in (V0_6, V0_11, V0_32)],
        (None, {"response_format": JSON_SCHEMA}, "response_format"),
        (None, {"response_format": {"type": "json_object"}}, "response_format"),
        (None, {"response_format": {"type": "text"}}, None),  # asks for nothing
        # structural tags: from 0.12 only; a schema-less json_schema has no older form to go in
        (V0_11, {"response_format": TAG}, "response_format"),
        (V0_12, {"response_format": TAG}, None),
        (V0_10, {"response_format": NO_SCHEMA}, "response_format"),
        (V0_32, {"response_format": NO_SCHEMA}, None),  # 0.32 answers its own 400 for it
        # prompt_embeds from 0.10.1; an absent or empty prompt next to them is no empty prompt
        (V0_10_0, {"prompt_embeds": "UEsDBA=="}, "prompt_embeds"),
        (None, {"prompt_embeds": "UEsDBA=="}, "prompt_embeds"),
        (V0_10, {"prompt_embeds": "UEsDBA=="}, None),
        (V0_32, {"prompt": None, "prompt_embeds": ["UEsDBA==", "gAJ9cQAu"]}, None),
        (V0_32, {"prompt": ""}, "prompt"),
    ],
)
def test_refused_by_version(version: VLLMVersion | None, fields: dict[str, Any], refused: str | None) -> None:
    table = capabilities_for(VLLMFeatures.of(version))
    assert table.first_violation(_req(**fields)) == refused
    if refused is not None:
        assert table.reason(refused)


def test_levels_by_version() -> None:
    level = {v: capabilities_for(VLLMFeatures.of(v)).level("response_format") for v in (None, V0_10, V0_11, V0_32)}
    assert level == {None: Level.UNSUPPORTED, V0_10: Level.TRANSLATED, V0_11: Level.TRANSLATED, V0_32: Level.NATIVE}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


ANSWER = {
    "id": "c", "object": "text_completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "text": "{}", "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}  # fmt: skip


async def _sent(mock: respx.MockRouter, version: str, **fields: Any) -> dict[str, Any]:
    """The body one request reaches a vLLM of ``version`` with."""
    route = mock.post(URL + "/completions").mock(return_value=httpx.Response(200, json=ANSWER))
    config = {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx", "version": version}
    backend = VLLMBackend(VLLMBackendConfig.model_validate(config))
    try:
        await backend.complete(UpstreamCall(_req(**fields), "m", "p", "r"))
    finally:
        await backend.close()
    body: dict[str, Any] = orjson.loads(route.calls[-1].request.content)
    return body


@pytest.mark.parametrize(
    ("version", "fields", "expected"),
    [
        ("0.32.0", {"response_format": JSON_SCHEMA}, {"response_format": JSON_SCHEMA}),
        # 0.11 applies json_object only inside structured_outputs, and json_schema not at all
        ("0.11.0", {"response_format": JSON_SCHEMA}, {"structured_outputs": {"json": SCHEMA}}),
        ("0.11.0", {"response_format": {"type": "json_object"}}, {"structured_outputs": {"json_object": True}}),
        (
            "0.11.0",
            {"response_format": JSON_SCHEMA, "structured_outputs": {"disable_any_whitespace": True}},
            {"structured_outputs": {"disable_any_whitespace": True, "json": SCHEMA}},
        ),
        # before: json_object is applied as sent (guided_json_object), a schema goes as guided_json
        ("0.10.1", {"response_format": {"type": "json_object"}}, {"response_format": {"type": "json_object"}}),
        ("0.6.3", {"response_format": JSON_SCHEMA}, {"guided_json": SCHEMA}),
        # prompt_embeds as sent, without a prompt of its own when the client sent none (or null)
        ("0.32.0", {"prompt": None, "prompt_embeds": "UEsDBA=="}, {"prompt_embeds": "UEsDBA=="}),
        ("0.32.0", {"prompt": ["a"], "prompt_embeds": "UEsDBA=="}, {"prompt": ["a"], "prompt_embeds": "UEsDBA=="}),
    ],
)
async def test_body_by_version(
    mock: respx.MockRouter, version: str, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    sent = await _sent(mock, version, **fields)
    keys = {"prompt", "response_format", "structured_outputs", "guided_json", "prompt_embeds"}
    prompt = {} if "prompt" in fields else {"prompt": "x"}  # the request's own prompt, unless the case sets one
    assert {k: v for k, v in sent.items() if k in keys} == {**prompt, **expected}


async def test_vllm_error_on_prompt_embeds_names_them(mock: respx.MockRouter) -> None:
    """A server without --enable-prompt-embeds refuses them naming the field: the client sees that name."""
    error = {"error": {"message": "You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
                       "type": "BadRequestError", "param": "prompt_embeds", "code": 400}}  # fmt: skip
    mock.post(URL + "/completions").mock(return_value=httpx.Response(400, json=error))
    config = {"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx", "version": "0.32.0"}
    backend = VLLMBackend(VLLMBackendConfig.model_validate(config))
    with pytest.raises(UpstreamStatusError) as caught:
        await backend.complete(UpstreamCall(_req(prompt=None, prompt_embeds="UEsDBA=="), "m", "p", "r"))
    await backend.close()
    assert caught.value.param == "prompt_embeds" and "--enable-prompt-embeds" in str(caught.value)


@pytest.mark.parametrize(
    ("first", "then", "sent", "resent"),
    [
        # upgraded behind a kept-alive connection: a guided_json the new server ignores is resent as-is
        ("0.10.1", "0.32.0", {"guided_json": SCHEMA}, {"response_format": JSON_SCHEMA}),
        # downgraded to 0.11, which ignores a format sent as-is (json_object alone too)
        ("0.32.0", "0.11.0", {"response_format": JSON_SCHEMA}, {"structured_outputs": {"json": SCHEMA}}),
    ],
)
async def test_format_answered_by_a_version_that_ignores_it_is_resent_in_its_form(
    mock: respx.MockRouter, first: str, then: str, sent: dict[str, Any], resent: dict[str, Any]
) -> None:
    version = mock.get("http://vllm.rf:8000/version")
    version.side_effect = [httpx.Response(200, json={"version": v}) for v in (first, then)]
    seen = {**ANSWER, "system_fingerprint": f"vllm-{then}-abc"}
    route = mock.post(URL + "/completions").mock(return_value=httpx.Response(200, json=seen))
    backend = VLLMBackend(
        VLLMBackendConfig.model_validate({"type": "vllm", "name": "v", "base_url": URL, "transport": "httpx"})
    )
    await backend.start()
    await backend.complete(UpstreamCall(_req(response_format=JSON_SCHEMA), "m", "p", "r"))
    await backend.close()
    bodies = [orjson.loads(c.request.content) for c in route.calls]
    keys = ("response_format", "structured_outputs", "guided_json")
    assert [{k: b[k] for k in keys if k in b} for b in bodies] == [sent, resent]


@pytest.mark.parametrize(
    ("sent", "server", "fmt", "ignored"),
    [
        ("0.32.0", "0.11.0", {"type": "json_object"}, True),  # 0.11 applies json_object only in structured_outputs
        ("0.32.0", "0.10.1", {"type": "json_object"}, False),  # as guided_json_object
        ("0.10.1", "0.32.0", {"type": "json_object"}, False),
        ("0.11.0", "0.32.0", JSON_SCHEMA, False),  # structured_outputs.json: every version from 0.11
        ("0.11.0", "0.10.1", JSON_SCHEMA, True),
        ("0.6.3", "0.11.0", JSON_SCHEMA, False),  # guided_json: until 0.12
        ("0.32.0", "0.33.0", JSON_SCHEMA, False),
    ],
)
def test_format_ignored_by_version(sent: str, server: str, fmt: dict[str, Any], ignored: bool) -> None:
    from backends.vllm.dialect import format_ignored
    from backends.vllm.versions import parse_version

    def features(text: str) -> VLLMFeatures:
        return VLLMFeatures.of(parse_version(text))

    assert format_ignored(_req(response_format=fmt), features(sent), features(server)) is ignored
