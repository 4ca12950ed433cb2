""" "No request with a guided_* field can come back unconstrained", on every version path;
plus the emulation, normalisation and error-mapping units.

The property test runs the real ``VLLMBackend`` against a respx fake of each vLLM
version's documented handling of unknown and removed fields (spec section 6):
0.6.3 refuses unknown fields; from 0.10.1 they are ignored; top-level guided_*
are applied before 0.12; ``structured_outputs`` from 0.11. The gateway's belief
about the version comes from detection, a pin, a wrong pin, nothing, or a
detection made before the server was upgraded. The client must get either a
400 or a constrained answer, never the fake's unconstrained text.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.base import TokenUsage, UpstreamCall
from backends.emulation.best_of import mean_token_logprob, pick_best_of, replicate_choices, scale_usage
from backends.errors import UpstreamError, UpstreamStatusError
from backends.vllm.adapter import VLLMBackend
from backends.vllm.dialect import UpstreamGenerationError, normalise_body, vllm_error
from backends.vllm.stream import has_foreign_finish_reason
from backends.vllm.versions import VLLMVersion, parse_version
from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import VLLMBackendConfig
from schemas.errors import GatewayError

URL = "http://vllm.fake:8000/v1"
VERSION_URL = "http://vllm.fake:8000/version"
GUIDES = {
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a", "b"],
    "guided_grammar": 'root ::= "a"',
}


class FakeVLLM:
    """What a vLLM of ``version`` does with the constraint forms (spec section 6)."""

    def __init__(self, version: str) -> None:
        self.version = parse_version(version) or VLLMVersion(0, 0, 0)
        self.text = version

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = orjson.loads(request.content)
        v = self.version
        guided = any(k in body for k in GUIDES)
        structured = "structured_outputs" in body
        if v < (0, 10, 1) and structured:  # extra="forbid"
            return httpx.Response(400, json={"object": "error", "message": "extra fields not permitted",
                                             "type": "BadRequestError", "param": None, "code": 400})  # fmt: skip
        applied = (guided and v < (0, 12, 0)) or (structured and v >= (0, 11, 0))
        text = "CONSTRAINED" if applied else "unconstrained"
        fingerprint = f"vllm-{self.text}-fake" if v >= (0, 10, 0) else None
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop", "stop_reason": None}
        if body.get("stream"):
            chunk = {"id": "c", "object": "text_completion", "created": 1, "model": body["model"], "choices": [choice]}
            usage = {**chunk, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            if fingerprint:
                usage["system_fingerprint"] = fingerprint
            sse = b"data: " + orjson.dumps(chunk) + b"\n\ndata: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"
            return httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
        answer = {
            "id": "c",
            "object": "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "system_fingerprint": fingerprint,
        }
        return httpx.Response(200, json=answer)


SERVERS = ["0.6.3", "0.10.1", "0.11.0", "0.12.0", "0.32.0", "0.33.0"]
# belief: how the gateway learns the version -> (pin, what /version answers at start, later)
BELIEFS = ["detected", "pinned", "wrong-pin", "unknown", "upgraded-from-0.10.1"]


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


async def gateway_backend(mock: respx.MockRouter, server: str, belief: str) -> VLLMBackend:
    pin = {"pinned": server, "wrong-pin": "0.10.1"}.get(belief)
    version = mock.get(VERSION_URL)
    if belief == "detected":
        version.mock(return_value=httpx.Response(200, json={"version": server}))
    elif belief == "upgraded-from-0.10.1":
        version.side_effect = [
            httpx.Response(200, json={"version": "0.10.1"}),
            *[httpx.Response(200, json={"version": server})] * 5,
        ]
    else:
        version.mock(return_value=httpx.Response(404))
    mock.post(URL + "/completions").mock(side_effect=FakeVLLM(server))
    config = {"type": "vllm", "name": "fake", "base_url": URL, "transport": "httpx"}
    backend = VLLMBackend(VLLMBackendConfig.model_validate({**config, **({"version": pin} if pin else {})}))
    await backend.start()
    backend._confirmed_at = -10.0  # time has passed since start-up (an upgrade may have happened)
    return backend


async def outcome(backend: VLLMBackend, guide: str, stream: bool) -> str:
    """``refused`` (a 4xx before or from the server) or the text the client got."""
    request = CompletionRequest.model_validate({"model": "p", "prompt": "x", guide: GUIDES[guide], "stream": stream})
    call = UpstreamCall(request, "m", "p", "r")
    if backend.capabilities.first_violation(request) is not None:
        return "refused"  # the router's check
    try:
        if not stream:
            result = await backend.complete(call)
            return str(orjson.loads(result.body)["choices"][0]["text"])
        relayed = await backend.stream(call)
        blocks = [block async for block in relayed]
        await relayed.aclose()
    except GatewayError as exc:
        assert exc.status == 400, exc
        return "refused"
    events = [orjson.loads(e[6:]) for e in b"".join(blocks).split(b"\n\n") if e.startswith(b"data: {")]
    return "".join(c["text"] for e in events for c in e["choices"])


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
@pytest.mark.parametrize("belief", BELIEFS)
@pytest.mark.parametrize("server", SERVERS)
async def test_no_guided_request_comes_back_unconstrained(
    mock: respx.MockRouter, server: str, belief: str, stream: bool
) -> None:
    backend = await gateway_backend(mock, server, belief)
    try:
        results = {guide: await outcome(backend, guide, stream) for guide in GUIDES}
    finally:
        await backend.close()
    assert set(results.values()) <= {"CONSTRAINED", "refused"}, results
    if belief in ("detected", "upgraded-from-0.10.1"):  # a known version always serves constraints
        assert set(results.values()) == {"CONSTRAINED"}, results


# --- emulation ----------------------------------------------------------------------------


def cand(index: int, text: str, logprobs: list[float | None]) -> dict[str, Any]:
    tokens = [f"t{i}" for i in range(len(logprobs))]
    lp = {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": list(range(len(tokens)))}
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": "length"}


def test_mean_token_logprob_skips_the_echoed_prompt_and_nulls() -> None:
    choice = cand(0, "x", [None, -10.0, -1.0, -3.0])
    assert mean_token_logprob(choice) == pytest.approx(-14 / 3)
    assert mean_token_logprob(choice, skip=2) == pytest.approx(-2.0)
    assert mean_token_logprob({"logprobs": None}) == -math.inf


def test_best_of_ranks_by_mean_not_sum_per_prompt() -> None:
    choices = [
        cand(0, "long", [-1.0, -1.0, -1.0, -1.0]),  # sum -4, mean -1
        cand(1, "short", [-1.5]),  # sum -1.5 (best by sum), mean -1.5
        cand(2, "best", [-0.5, -0.5]),
        cand(3, "p1-a", [-2.0]),
        cand(4, "p1-b", [-0.1]),
        cand(5, "p1-c", [-3.0]),
    ]
    picked = pick_best_of(choices, best_of=3, n=2, keep_logprobs=False)
    assert [(c["index"], c["text"]) for c in picked] == [(0, "best"), (1, "long"), (2, "p1-b"), (3, "p1-a")]
    assert all(c["logprobs"] is None for c in picked)
    kept = pick_best_of(choices, best_of=3, n=1, keep_logprobs=True)
    assert kept[0]["logprobs"] is choices[2]["logprobs"]


def test_ties_keep_upstream_order() -> None:
    picked = pick_best_of([cand(0, "a", [-1.0]), cand(1, "b", [-1.0])], best_of=2, n=1, keep_logprobs=False)
    assert picked[0]["text"] == "a"


def test_replicate_and_scale_usage() -> None:
    choices = [{"index": 0, "text": "x"}, {"index": 1, "text": "y"}]
    assert [(c["index"], c["text"]) for c in replicate_choices(choices, 3)] == [
        (0, "x"), (1, "x"), (2, "x"), (3, "y"), (4, "y"), (5, "y"),
    ]  # fmt: skip
    usage = {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert scale_usage(usage, 3) == {"prompt_tokens": 4, "completion_tokens": 15, "total_tokens": 19}
    assert scale_usage(None, 3) is None


# --- normalisation --------------------------------------------------------------------------


def vllm_body(finish: Any = "length", **extra: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 5,
        "model": "up",
        "choices": [
            {
                "index": 0,
                "text": "hi",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": "\n",
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": "vllm-0.32.0-x",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        "kv_transfer_params": None,
        "metrics": None,
        **extra,
    }


def test_normalise_keeps_only_openai_fields() -> None:
    out = normalise_body(vllm_body(), "pub", "b")
    assert list(out) == ["id", "object", "created", "model", "choices", "system_fingerprint", "usage"]
    assert out["choices"] == [{"text": "hi", "index": 0, "logprobs": None, "finish_reason": "length"}]
    assert out["model"] == "pub"


@pytest.mark.parametrize(("finish", "mapped"), [("repetition", "stop"), ("something_new", "stop"), (None, None)])
def test_finish_reasons_outside_openai_map_to_stop(finish: Any, mapped: Any) -> None:
    assert normalise_body(vllm_body(finish), "p", "b")["choices"][0]["finish_reason"] == mapped


@pytest.mark.parametrize(("finish", "retryable"), [("abort", True), ("error", False)])
def test_abort_and_error_are_errors(finish: str, retryable: bool) -> None:
    with pytest.raises(UpstreamGenerationError) as info:
        normalise_body(vllm_body(finish), "p", "b")
    assert info.value.status == 502 and info.value.retryable is retryable


def test_foreign_finish_scan() -> None:
    assert not has_foreign_finish_reason(b'data: {"choices":[{"finish_reason":null}]}\n\n')
    assert not has_foreign_finish_reason(b'{"finish_reason":"stop"}{"finish_reason":"length"}')
    assert has_foreign_finish_reason(b'{"finish_reason":"stop"}{"finish_reason":"abort"}')
    assert has_foreign_finish_reason(b'{"finish_reason":"repetition"}')


REQ = CompletionRequest.model_validate({"model": "p", "prompt": "x", "guided_choice": ["a"]})


@pytest.mark.parametrize(
    ("status", "body", "param", "message"),
    [
        (400, {"object": "error", "message": "m1", "type": "BadRequestError", "param": "max_tokens", "code": 400},
         "max_tokens", "m1"),
        (400, {"error": {"message": "m2", "type": "BadRequestError", "param": "structured_outputs", "code": 400}},
         "guided_choice", "m2"),
        (400, {"error": {"message": "m3", "type": "BadRequestError", "param": "input_tokens", "code": 400}},
         "prompt", "m3"),
        (400, {"error": {"message": "m4", "type": "BadRequestError", "param": "mm_processor_kwargs", "code": 400}},
         None, "m4"),
        (422, {"error": {"message": "m5", "type": "UnprocessableEntityError", "param": "stop", "code": 422}},
         "stop", "m5"),
        (400, {"detail": "m6"}, None, "m6"),
    ],
)  # fmt: skip
def test_vllm_error_bodies_become_our_envelope(status: int, body: Any, param: str | None, message: str) -> None:
    error = vllm_error(status, orjson.dumps(body), None, "b", REQ)
    assert error.envelope()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
    assert error.status == 400


@pytest.mark.parametrize(("param", "kept"), [("mm_processor_kwargs", True), ("request_id", True), ("suffix", False)])
def test_a_vllm_error_keeps_a_param_of_the_chat_request(param: str, kept: bool) -> None:
    # vLLM 0.32 names the chat field it refuses (mm_processor_kwargs without --trust-request-mm-kwargs).
    chat = ChatCompletionRequest.model_validate({"model": "p", "messages": [{"role": "user", "content": "x"}]})
    body = {"error": {"message": "m", "type": "BadRequestError", "param": param, "code": 400}}
    error = vllm_error(400, orjson.dumps(body), None, "b", chat)
    assert error.param == (param if kept else None)


def test_vllm_401_and_5xx() -> None:
    auth = vllm_error(401, b'{"error":"Unauthorized"}', None, "b", REQ)
    assert auth.status == 502 and auth.code == "upstream_auth_failed"
    down = vllm_error(503, b'{"error":{"message":"engine dead","type":"ServiceUnavailableError","code":503}}',
                      "3", "b", REQ)  # fmt: skip
    assert isinstance(down, UpstreamStatusError) and down.status == 503 and down.retryable
    assert down.retry_after == 3.0 and "engine dead" not in down.message  # 5xx text stays inside


async def test_stream_abort_ends_with_an_error_not_a_finish(mock: respx.MockRouter) -> None:
    chunk = b'data: {"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    sse = (
        chunk + b'"text":" a","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        + chunk + b'"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null}]}\n\n'
        + b"data: [DONE]\n\n"
    )  # fmt: skip
    mock.get(VERSION_URL).mock(return_value=httpx.Response(200, json={"version": "0.32.0"}))
    mock.post(URL + "/completions").mock(
        return_value=httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
    )
    config = {"type": "vllm", "name": "f", "base_url": URL, "transport": "httpx"}
    backend = VLLMBackend(VLLMBackendConfig.model_validate(config))
    await backend.start()
    request = CompletionRequest.model_validate({"model": "p", "prompt": "x", "stream": True})
    stream = await backend.stream(UpstreamCall(request, "m", "p", "r"))
    got: list[bytes] = []
    with pytest.raises(UpstreamError) as info:
        async for block in stream:
            got.append(block)
    await stream.aclose()
    await backend.close()
    assert b'" a"' in b"".join(got) and b"abort" not in b"".join(got)
    assert info.value.status == 502
    assert stream.usage is None or isinstance(stream.usage, TokenUsage)
