"""A real vLLM 0.32 pooling server (the tiny model, ``--runner pooling --convert embed``) behind the gateway.

Each answer through the gateway is compared with the same request sent to vLLM directly: float
and base64 vectors identical, token-id input, ``truncate_prompt_tokens``, usage equal, vLLM's
encoding extras (``embed_dtype``, ``endianness``, the ``bytes`` answer), rerank, and vLLM's own
refusals (``dimensions`` on a model without matryoshka) reaching the client with the field named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import HERE, STAMP, VENV, _model_dir, _wait_healthy
from tests.conftest import free_port, serve_app

pytestmark = pytest.mark.vllm

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world"]


@pytest.fixture(scope="module")
def pooling_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not STAMP.exists():
        pytest.skip(f"no vLLM environment at {VENV}")
    model = _model_dir()
    scratch = tmp_path_factory.mktemp("vllm-pooling")
    port = free_port()
    env = {
        **os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TMPDIR": str(scratch),
        "VLLM_CACHE_ROOT": str(scratch / "cache"),
    }  # fmt: skip
    args = [
        str(VENV / "bin" / "python"), str(HERE / "launch_vllm.py"), "serve", str(model),
        "--served-model-name", "tiny-embed", "--host", "127.0.0.1", "--port", str(port),
        "--runner", "pooling", "--convert", "embed",
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", "64M",
        "--chat-template", str(HERE / "chat_template.jinja"),  # for chat-style embeddings (messages)
    ]  # fmt: skip
    log = scratch / "vllm.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = time.monotonic()
        _wait_healthy(url, proc, log)
        print(f"\nvLLM pooling server ready in {time.monotonic() - started:.1f}s at {url}")
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@pytest.fixture
async def gateway_url(pooling_server: str) -> AsyncIterator[str]:
    config = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: real, type: vllm, base_url: {pooling_server}/v1, timeout: {{connect: 5, first_byte: 60, total: 120}}}}
models:
  - {{name: emb, routes: [{{backend: real, model: tiny-embed}}], endpoints: [embeddings, rerank]}}
"""
    app = create_app(parse_config(config, "<real pooling>", env={}))
    runner, url = await serve_app(app)
    try:
        yield url
    finally:
        await runner.cleanup()


async def both(gateway: str, direct: str, path: str, body: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The same request through the gateway (model ``emb``) and straight to vLLM (``tiny-embed``)."""
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway + path, json={**body, "model": "emb"}) as r:
            through = (r.status, await r.read(), dict(r.headers))
        async with s.post(direct + path, json={**body, "model": "tiny-embed"}) as r:
            straight = (r.status, await r.read(), dict(r.headers))
    return through, straight, None


def same_answer(through: Any, straight: Any) -> dict[str, Any]:
    assert through[0] == straight[0] == 200, (through[1][:500], straight[1][:500])
    mine, theirs = orjson.loads(through[1]), orjson.loads(straight[1])
    assert mine["model"] == "emb"
    assert mine["data"] == theirs["data"]  # vectors identical, bit for bit as JSON
    assert mine["usage"] == theirs["usage"]
    return dict(mine)


@pytest.mark.parametrize("encoding", ["float", "base64"])
@pytest.mark.parametrize("value", [TEXTS[0], TEXTS, [5, 6, 7, 8], [[5, 6], [7, 8, 9]]])
async def test_embeddings_identical_to_direct(gateway_url: str, pooling_server: str, encoding: str, value: Any) -> None:
    through, straight, _ = await both(
        gateway_url, pooling_server, "/v1/embeddings", {"input": value, "encoding_format": encoding}
    )
    same_answer(through, straight)


async def test_truncate_prompt_tokens_and_usage(gateway_url: str, pooling_server: str) -> None:
    through, straight, _ = await both(
        gateway_url, pooling_server, "/v1/embeddings", {"input": TEXTS[0], "truncate_prompt_tokens": 3}
    )
    assert same_answer(through, straight)["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("endianness", ["big", "little"])
async def test_vllm_encoding_extras(gateway_url: str, pooling_server: str, dtype: str, endianness: str) -> None:
    body = {"input": TEXTS, "encoding_format": "base64", "embed_dtype": dtype, "endianness": endianness}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    same_answer(through, straight)


@pytest.mark.parametrize("encoding", ["bytes", "bytes_only"])
async def test_binary_answer_relayed(gateway_url: str, pooling_server: str, encoding: str) -> None:
    body = {"input": TEXTS, "encoding_format": encoding, "embed_dtype": "float16"}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    assert through[0] == straight[0] == 200
    assert through[1] == straight[1]  # the bytes as vLLM sent them
    assert through[2]["Content-Type"] == "application/octet-stream"
    if encoding == "bytes":
        mine, theirs = orjson.loads(through[2]["metadata"]), orjson.loads(straight[2]["metadata"])
        assert mine["model"] == "emb" and mine["data"] == theirs["data"] and mine["usage"] == theirs["usage"]
    else:
        assert "metadata" not in through[2]


async def test_openai_sdk_default_base64_decodes_to_the_float_answer(gateway_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0) as client:
        default = await client.embeddings.create(model="emb", input=TEXTS)  # the SDK asks base64, decodes it
        floats = await client.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]


async def test_rerank_like_direct(gateway_url: str, pooling_server: str) -> None:
    body = {"query": "quick fox", "documents": ["the quick brown fox", "hello world", "lazy dog"], "top_n": 2}
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/rerank", body)
    assert through[0] == straight[0] == 200, through[1]
    mine, theirs = orjson.loads(through[1]), orjson.loads(straight[1])
    assert [(r["index"], r["relevance_score"]) for r in mine["results"]] == [
        (r["index"], r["relevance_score"]) for r in theirs["results"]
    ]
    assert [r["document"]["text"] for r in mine["results"]] == [r["document"]["text"] for r in theirs["results"]]
    assert mine["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


CONVERSATION = [{"role": "user", "content": "The cat sat on the mat."}, {"role": "assistant", "content": "A cat"}]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": CONVERSATION},
        {"messages": CONVERSATION, "add_generation_prompt": True},
        {"messages": CONVERSATION, "continue_final_message": True, "add_special_tokens": True},
        {"messages": [CONVERSATION, CONVERSATION[:1]], "encoding_format": "base64"},
    ],
    ids=["one", "generation-prompt", "continue", "batch"],
)
async def test_chat_style_embeddings_like_direct(gateway_url: str, pooling_server: str, body: dict[str, Any]) -> None:
    through, straight, _ = await both(gateway_url, pooling_server, "/v1/embeddings", body)
    same_answer(through, straight)


async def test_vllm_refusals_reach_the_client_named(gateway_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway_url + "/v1/embeddings", json={"model": "emb", "input": "x", "dimensions": 8}) as r:
            assert r.status == 400
            error = (await r.json())["error"]
        body = {"model": "emb", "input": "x", "truncate_prompt_tokens": 100_000}
        async with s.post(gateway_url + "/v1/embeddings", json=body) as r:
            assert r.status == 400
    assert "dimension" in error["message"].lower() or "matryoshka" in error["message"].lower()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {"prompt": TEXTS[0], "return_token_strs": True}),
        ("/tokenize", {"prompt": TEXTS[1], "add_special_tokens": False}),
        ("/tokenize", {"messages": CONVERSATION, "add_generation_prompt": True}),
        ("/detokenize", {"tokens": [5, 6, 7, 8]}),
    ],
    ids=["prompt", "no-special", "messages", "detokenize"],
)
async def test_tokenizer_like_direct(gateway_url: str, pooling_server: str, path: str, body: dict[str, Any]) -> None:
    through, straight, _ = await both(gateway_url, pooling_server, path, body)
    assert through[0] == straight[0] == 200, through[1]
    assert orjson.loads(through[1]) == orjson.loads(straight[1])


async def test_models_carry_the_servers_max_model_len(gateway_url: str) -> None:
    async with openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="x", max_retries=0) as client:
        model = (await client.models.retrieve("emb")).model_dump()
    assert model["max_model_len"] == 512  # --max-model-len, as the server's GET /v1/models says
    assert model["root"] == str(_model_dir())
    assert model["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
