"""The ``llamacpp`` backend against a real ``llama-server`` (marker ``llamacpp``; skipped without one).

Needs a ``llama-server`` binary (``GATEWAY_LLAMA_SERVER``, or on ``PATH``) and the ``gguf``
package (the tiny model is written by ``build_model.py`` beside this file). The binary
can be built from the llama.cpp sources that the ``llama-cpp-python`` sdist vendors:
``tests/backends/native/real_llamacpp/build_server.sh``. Not part of CI: the build takes longer than CI's
budget allows next to the rest (figures in that script).

Through the gateway with the official client: greedy determinism, streaming equal to the
non-streaming text, usage, logprobs whose ``text_offset`` point into the text, stop and
``include_stop_str_in_output``, ``n``/``best_of`` fan-out, echo of a token-id prompt via
``/detokenize``, ``guided_choice``/``guided_json`` through llama.cpp grammars, and a
native 400 passed on.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import pytest_asyncio

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import free_port, serve_app

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

HERE = Path(__file__).resolve().parent
MODEL = "tiny"


def _server_binary() -> str | None:
    return os.environ.get("GATEWAY_LLAMA_SERVER") or shutil.which("llama-server")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = _server_binary()
    if binary is None:
        pytest.skip(
            "no llama-server (set GATEWAY_LLAMA_SERVER; see tests/backends/native/real_llamacpp/build_server.sh)"
        )
    pytest.importorskip("gguf")
    model = tmp_path_factory.mktemp("llamacpp") / "tiny.gguf"
    subprocess.run([sys.executable, str(HERE / "build_model.py"), str(model)], check=True)
    port = free_port()
    args = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "4"]
    log = (model.parent / "server.log").open("wb")
    proc = subprocess.Popen([*args, "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {(model.parent / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("llama-server did not become healthy in 30 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(llama_server: str) -> AsyncIterator[openai.AsyncOpenAI]:
    text = (
        "server: {host: 127.0.0.1, port: 0}\n"
        f"backends:\n  - name: llama\n    type: llamacpp\n    base_url: {llama_server}\n"
        f"models:\n  - name: {MODEL}\n    routes: [{{backend: llama, model: tiny}}]\n"
    )
    runner, url = await serve_app(create_app(parse_config(text, "<test config>", env={})))
    try:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60) as c:
            yield c
    finally:
        await runner.cleanup()


PROMPT = "The quick brown fox"


async def test_greedy_is_deterministic_and_counted(client: openai.AsyncOpenAI) -> None:
    one = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    two = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    assert one.choices[0].text == two.choices[0].text
    assert one.choices[0].finish_reason in ("stop", "length")
    assert one.usage is not None and 0 < one.usage.prompt_tokens <= len(PROMPT)
    assert 0 < one.usage.completion_tokens <= 12
    if one.choices[0].finish_reason == "length":
        assert one.usage.completion_tokens == 12


async def test_default_max_tokens_is_openais_16(client: openai.AsyncOpenAI) -> None:
    resp = await client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    assert resp.usage is not None and resp.usage.completion_tokens == 16
    assert resp.choices[0].finish_reason == "length"


async def test_stream_matches_the_non_streamed_text(client: openai.AsyncOpenAI) -> None:
    whole = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0)
    stream = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


async def test_logprobs_offsets_point_into_the_text(client: openai.AsyncOpenAI) -> None:
    resp = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    choice = resp.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.text_offset and lp.token_logprobs and lp.top_logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == choice.text
    for token, offset, top, value in zip(lp.tokens, lp.text_offset, lp.top_logprobs, lp.token_logprobs, strict=True):
        assert choice.text[offset : offset + len(token)] == token
        assert value is not None and value <= 0
        assert token in top and 1 <= len(top) <= 3  # 2 alternatives and the chosen token
        assert max(top.values()) == top[token]  # greedy picks the most likely


async def test_stop_is_cut_or_kept(client: openai.AsyncOpenAI) -> None:
    base = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].text
    stop = text[4:6]
    assert stop and text.find(stop) >= 0
    cut = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    kept = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )  # fmt: skip
    assert kept.choices[0].text == text[: text.find(stop) + len(stop)]


async def test_n_and_best_of_fan_out(client: openai.AsyncOpenAI) -> None:
    resp = await client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], n=2, max_tokens=6, seed=11)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    again = await client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], n=2, max_tokens=6, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in resp.choices]  # seeds make it reproducible
    best = await client.completions.create(model=MODEL, prompt=PROMPT, best_of=3, max_tokens=6, seed=3)
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    assert best.usage is not None and best.usage.completion_tokens <= 18


async def test_echo_of_a_token_prompt_uses_detokenize(client: openai.AsyncOpenAI) -> None:
    tokens = [42, 43, 44]  # three byte tokens
    resp = await client.completions.create(model=MODEL, prompt=tokens, max_tokens=4, temperature=0, echo=True)
    plain = await client.completions.create(model=MODEL, prompt=tokens, max_tokens=4, temperature=0)
    assert resp.choices[0].text.endswith(plain.choices[0].text)
    assert len(resp.choices[0].text) == 3 + len(plain.choices[0].text)


async def test_grammars_constrain_the_output(client: openai.AsyncOpenAI) -> None:
    choice = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert choice.choices[0].text in ("yes", "no")
    schema = {"type": "string", "enum": ["red", "green"]}
    js = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, extra_body={"guided_json": schema})
    assert js.choices[0].text in ('"red"', '"green"')


async def test_native_400_is_passed_on(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=MODEL, prompt="x" * 3000, max_tokens=4)
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "invalid_request_error"


async def test_client_disconnect_mid_stream_leaves_the_server_usable(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=200, stream=True, extra_body={"ignore_eos": True}
    )
    async for _ in stream:
        break
    await stream.close()
    await asyncio.sleep(0.2)
    resp = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert resp.choices
