"""Issue 13 on the native backends: what a server cannot carry is an error naming the field.

- items 13/14/18: ``prompt: ""`` (or null, "the start of a document") is refused by name on
  Ollama (which reads it as "load the model") and TGI (422 on empty ``inputs``), before any
  upstream request, so it can never count as a backend failure;
- item 20: an Ollama that ignores ``logprobs`` answers 200 without them; the gateway turns
  that into an upstream error naming ``logprobs`` instead of an empty success;
- the refusal error is built in one place (``Capabilities.refusal``) for router and adapters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx

from backends.capabilities import Capabilities, Level
from backends.errors import UpstreamProtocolError
from backends.native.common import first_stop
from schemas.completions import CompletionRequest
from schemas.errors import UnsupportedParameterError
from tests.backends.native.helpers import drain, fixture, make_backend, make_call, route, stream_response


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False, assert_all_mocked=True) as router:
        yield router


def _without_logprobs(body: bytes, *, ndjson: bool) -> bytes:
    """The golden Ollama answer as an Ollama without logprobs support sends it."""
    if not ndjson:
        obj = orjson.loads(body)
        obj.pop("logprobs", None)
        return orjson.dumps(obj)
    lines = []
    for line in body.splitlines():
        if line.strip():
            obj = orjson.loads(line)
            obj.pop("logprobs", None)
            lines.append(orjson.dumps(obj))
    return b"\n".join(lines) + b"\n"


async def test_ollama_ignoring_logprobs_is_an_error_naming_logprobs(mock: respx.MockRouter) -> None:
    body = _without_logprobs(fixture("ollama/generate.json"), ndjson=False)
    route(mock, "ollama").mock(return_value=httpx.Response(200, content=body))
    backend = make_backend("ollama")
    with pytest.raises(UpstreamProtocolError) as caught:
        await backend.complete(make_call("ollama", logprobs=1, stop="."))
    assert caught.value.param == "logprobs"
    assert caught.value.status == 502 and caught.value.backend == "ollama-a"
    # Without logprobs asked for, the same answer is a plain success.
    result = await backend.complete(make_call("ollama", stop="."))
    assert orjson.loads(result.body)["choices"][0]["text"] == " Paris"


async def test_ollama_ignoring_logprobs_ends_the_stream_with_an_error(mock: respx.MockRouter) -> None:
    body = _without_logprobs(fixture("ollama/generate_stream.ndjson"), ndjson=True)
    route(mock, "ollama").mock(return_value=stream_response(body, "application/x-ndjson"))
    backend = make_backend("ollama")
    stream = await backend.stream(make_call("ollama", logprobs=1, stream=True, stop="."))
    with pytest.raises(UpstreamProtocolError) as caught:
        await drain(stream)
    assert caught.value.param == "logprobs"


@pytest.mark.parametrize("kind", ["ollama", "tgi"])
@pytest.mark.parametrize("prompt", ["", None, ["a", ""]])
async def test_empty_prompt_refused_by_name_without_an_upstream_call(
    mock: respx.MockRouter, kind: str, prompt: Any
) -> None:
    upstream = route(mock, kind)
    backend = make_backend(kind)
    with pytest.raises(UnsupportedParameterError) as caught:
        await backend.complete(make_call(kind, prompt=prompt))
    assert caught.value.param == "prompt" and caught.value.status == 400
    assert "empty prompt" in caught.value.message
    assert not upstream.called


async def test_llamacpp_serves_an_empty_prompt(mock: respx.MockRouter) -> None:
    upstream = route(mock, "llamacpp").mock(
        return_value=httpx.Response(200, content=fixture("llamacpp/completion.json"))
    )
    backend = make_backend("llamacpp")
    await backend.complete(make_call("llamacpp", prompt=None, stop="."))
    assert orjson.loads(upstream.calls[0].request.content)["prompt"] == ""


def test_refusal_is_one_constructor_for_limits_and_levels() -> None:
    table = Capabilities.of(Level.NATIVE, top_k=Level.UNSUPPORTED).with_limits({"logprobs": 5})
    request = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 6})
    error = table.refusal(request, "b", "openai")
    assert error is not None and error.param == "logprobs" and "at most 5" in error.message
    request = CompletionRequest.model_validate({"model": "m", "prompt": "x", "top_k": 3})
    error = table.refusal(request, "b", "openai")
    assert error is not None and error.param == "top_k" and "(type openai)" in error.message
    assert table.refusal(CompletionRequest.model_validate({"model": "m", "prompt": "x", "top_k": -1}), "b", "x") is None


def test_first_stop_is_shared_with_the_mock() -> None:
    import backends.mock as mock_backend

    assert not hasattr(mock_backend, "_first_stop")
    assert first_stop("abcdef", ["cde", "bc"]) == (1, 3)
