"""End to end with the official ``openai`` client: through the gateway to real HTTP upstreams.

The gateway runs in-process on loopback (``conftest.gateway``); its ``openai`` and
``vllm`` backends talk HTTP to ``FakeUpstream``, the ``mock`` backend simulates. The
last tests start the real ``gateway`` CLI as a subprocess.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import (
    MOCK_MODEL,
    OPENAI_MODEL,
    UPSTREAM_IDS,
    VLLM_MODEL,
    RunningGateway,
    free_port,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "deploy" / "examples" / "quickstart.yaml"
HTTP_MODELS = [OPENAI_MODEL, VLLM_MODEL]
ALL_MODELS = [OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL]


@pytest.fixture
async def client(gateway: RunningGateway) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


# --- completions ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ALL_MODELS)
async def test_non_streaming(client: openai.AsyncOpenAI, gateway: RunningGateway, model: str) -> None:
    resp = await client.completions.create(model=model, prompt="Say hello", max_tokens=4)
    assert resp.model == model
    assert resp.object == "text_completion"
    assert len(resp.choices) == 1
    assert resp.choices[0].text
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.completion_tokens > 0
    seen = gateway.upstream.requests
    if model in HTTP_MODELS:
        assert resp.choices[0].text == " hello world"
        assert len(seen) == 1
        assert seen[0].path == "/v1/completions"
        assert seen[0].body["model"] == UPSTREAM_IDS[model]
        assert seen[0].body["prompt"] == "Say hello"
        assert seen[0].body["max_tokens"] == 4
        assert "stream" not in seen[0].body
    else:
        assert seen == []  # the mock backend never goes upstream


@pytest.mark.parametrize("model", ALL_MODELS)
async def test_streaming_with_usage(client: openai.AsyncOpenAI, gateway: RunningGateway, model: str) -> None:
    stream = await client.completions.create(
        model=model, prompt="Say hello", max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) >= 2
    assert all(chunk.model == model for chunk in chunks)
    *body, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 4
    assert last.usage.total_tokens == last.usage.prompt_tokens + 4
    assert all(chunk.choices for chunk in body)
    assert all(chunk.usage is None for chunk in body)
    finishes = [c.finish_reason for chunk in body for c in chunk.choices]
    assert finishes[-1] in ("stop", "length")
    assert all(f is None for f in finishes[:-1])
    text = "".join(c.text for chunk in body for c in chunk.choices)
    seen = gateway.upstream.requests
    if model in HTTP_MODELS:
        assert text == " t0 t1 t2 t3"
        assert len(seen) == 1
        assert seen[0].body["model"] == UPSTREAM_IDS[model]
        assert seen[0].body["stream"] is True
        assert seen[0].body["stream_options"] == {"include_usage": True}
    else:
        assert text and seen == []


@pytest.mark.parametrize("model", HTTP_MODELS)
async def test_streaming_without_usage_drops_gateway_usage_chunk(
    client: openai.AsyncOpenAI, gateway: RunningGateway, model: str
) -> None:
    """The gateway asks the upstream for usage (for metrics) but the client did not: no usage chunk."""
    stream = await client.completions.create(model=model, prompt="Say hello", max_tokens=3, stream=True)
    chunks = [chunk async for chunk in stream]
    assert [c.choices[0].text for c in chunks] == [" t0", " t1", " t2"]
    assert all(c.usage is None and c.model == model for c in chunks)
    assert gateway.upstream.requests[0].body["stream_options"] == {"include_usage": True}


# --- vLLM extras and capabilities ---------------------------------------------------------


async def test_vllm_extras_reach_vllm_upstream(client: openai.AsyncOpenAI, gateway: RunningGateway) -> None:
    resp = await client.completions.create(
        model=VLLM_MODEL, prompt="hi", max_tokens=2, extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2}
    )
    assert resp.model == VLLM_MODEL
    body = gateway.upstream.requests[0].body
    assert body["top_k"] == 5
    assert body["min_p"] == 0.1
    assert body["repetition_penalty"] == 1.2


@pytest.mark.parametrize("model", [OPENAI_MODEL, MOCK_MODEL])
async def test_vllm_extra_refused_on_backend_without_it(
    client: openai.AsyncOpenAI, gateway: RunningGateway, model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=model, prompt="hi", max_tokens=2, extra_body={"top_k": 5})
    err = info.value
    assert err.status_code == 400
    assert err.param == "top_k"
    assert err.code == "unsupported_parameter"
    assert gateway.upstream.requests == []


async def test_neutral_vllm_extra_accepted_on_openai_backend(
    client: openai.AsyncOpenAI, gateway: RunningGateway
) -> None:
    resp = await client.completions.create(model=OPENAI_MODEL, prompt="hi", max_tokens=2, extra_body={"top_k": -1})
    assert resp.model == OPENAI_MODEL
    # The neutral value means "off": it is not forwarded to a provider that would reject it.
    assert "top_k" not in gateway.upstream.requests[0].body


# --- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),  # above every backend's bound (OpenAI 5, vLLM --max-logprobs 20)
        ({"logprobs": -1}, "logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
    ],
)
@pytest.mark.parametrize("model", ALL_MODELS)
async def test_invalid_values_name_the_param(
    client: openai.AsyncOpenAI, gateway: RunningGateway, model: str, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=model, prompt="hi", **kwargs)
    assert info.value.status_code == 400
    assert info.value.param == param
    body = info.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"
    if param == "no_such_field":
        assert info.value.code == "unknown_parameter"
    assert gateway.upstream.requests == []


async def test_invalid_value_in_stream_request_is_a_plain_400(
    client: openai.AsyncOpenAI, gateway: RunningGateway
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=OPENAI_MODEL, prompt="hi", temperature=3, stream=True)
    assert info.value.param == "temperature"


async def test_unknown_model(client: openai.AsyncOpenAI, gateway: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.completions.create(model="no-such-model", prompt="hi")
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.param == "model"
    assert gateway.upstream.requests == []


async def test_models_list(client: openai.AsyncOpenAI) -> None:
    page = await client.models.list()
    assert [m.id for m in page.data] == ALL_MODELS
    assert all(m.object == "model" for m in page.data)


async def test_concurrent_requests(client: openai.AsyncOpenAI, gateway: RunningGateway) -> None:
    async def one(i: int) -> str:
        model = ALL_MODELS[i % 3]
        resp = await client.completions.create(model=model, prompt=f"p{i}", max_tokens=2)
        return resp.model

    got = await asyncio.gather(*(one(i) for i in range(30)))
    assert got == [ALL_MODELS[i % 3] for i in range(30)]
    assert len(gateway.upstream.requests) == 20


# --- the real CLI ------------------------------------------------------------------------


def _gateway_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


async def _wait_healthy(url: str, proc: asyncio.subprocess.Process, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise AssertionError(f"gateway exited early with {proc.returncode}")
            try:
                async with session.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("gateway did not become healthy in time")


async def test_cli_serve_quickstart_and_sigterm() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *_gateway_cmd("serve", "--config", str(QUICKSTART), "--host", "127.0.0.1", "--port", str(port)),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await _wait_healthy(url, proc)
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10) as client:
            resp = await client.completions.create(model="demo-model", prompt="Hello there", max_tokens=5)
            assert resp.model == "demo-model"
            assert resp.choices[0].text
            assert resp.usage is not None and resp.usage.completion_tokens == 5
            stream = await client.completions.create(
                model="demo-model", prompt="Hello", max_tokens=3, stream=True, stream_options={"include_usage": True}
            )
            chunks = [c async for c in stream]
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            models = await client.models.list()
            assert [m.id for m in models.data] == ["demo-model", "demo-chat", "demo-embed"]
            chat = await client.chat.completions.create(
                model="demo-chat", messages=[{"role": "user", "content": "Hello"}], max_completion_tokens=5
            )
            assert chat.model == "demo-chat" and chat.choices[0].message.content
            with pytest.raises(openai.NotFoundError):  # demo-chat is served on chat only
                await client.completions.create(model="demo-chat", prompt="Hello", max_tokens=2)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        rc = await asyncio.wait_for(proc.wait(), timeout=30)
        assert rc == 0
        assert time.monotonic() - started < 30  # timing-only sanity: a real process, real time
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    _, stderr = await proc.communicate()
    assert b"Traceback" not in stderr, stderr.decode()


def test_cli_check_config_good() -> None:
    done = subprocess.run(_gateway_cmd("check-config", str(QUICKSTART)), cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    assert b"OK" in done.stdout


def test_cli_check_config_bad(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        """
server: {port: 99999, bogus: 1}
backends:
  - name: a
    type: nope
  - name: b
    type: openai
    base_url: not a url
models:
  - name: m
    routes: [{backend: b, model: x}]
""",
        encoding="utf-8",
    )
    done = subprocess.run(_gateway_cmd("check-config", str(bad)), cwd=ROOT, capture_output=True, timeout=30)
    assert done.returncode == 1
    err = done.stderr.decode()
    # each as file:line:column: YAML path: message, all in one run
    for path, line in (("server.port", 2), ("server.bogus", 2), ("backends[0].type", 5), ("backends[1].base_url", 8)):
        assert f"  {bad}:{line}:" in err and f": {path}: " in err, err
    assert "did you mean" not in err  # nothing here is near a valid name
    assert "Traceback" not in err


def test_cli_serve_refuses_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: []\nmodels: []\n", encoding="utf-8")
    done = subprocess.run(
        _gateway_cmd("serve", "--config", str(bad), "--port", str(free_port())),
        cwd=ROOT,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert b"backends" in done.stderr and b"Traceback" not in done.stderr
