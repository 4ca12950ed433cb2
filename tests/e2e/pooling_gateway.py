"""A gateway with one embedding model per backend type, all on one fake pooling upstream.

Models ``emb-<type>`` (``openai``, ``vllm`` pinned to 0.32.0, ``ollama``, ``llamacpp``, ``tei``,
``mock``), each listing the pooling endpoints its backend serves; ``gen`` is a generation model
on the mock (served on completions and chat only, by default).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app
from tests.pooling_upstream import PoolingUpstream

RERANKERS = ["openai", "vllm", "tei", "mock"]
EMBEDDERS = ["openai", "vllm", "ollama", "llamacpp", "tei", "mock"]
TOKEN_IDS_OK = ["openai", "vllm", "llamacpp", "tei", "mock"]


def pooling_config(url: str, *, tei_batch: int = 32, server: str = "", auth: str = "") -> str:
    def model(kind: str) -> str:
        endpoints = "[embeddings, rerank]" if kind in RERANKERS else "[embeddings]"
        return f"  - {{name: emb-{kind}, routes: [{{backend: b-{kind}, model: up-{kind}}}], endpoints: {endpoints}}}\n"

    timeout = "{connect: 2, first_byte: 10, total: 20, stream_idle: 10}"
    return (
        "server:\n  host: 127.0.0.1\n  port: 0\n"
        + "".join(f"  {line.strip()}\n" for line in server.splitlines() if line.strip())
        + f"""backends:
  - {{name: b-openai, type: openai, base_url: {url}/v1, api_key: sk-secret, timeout: {timeout}}}
  - {{name: b-vllm, type: vllm, base_url: {url}/v1, version: 0.32.0, timeout: {timeout}}}
  - {{name: b-ollama, type: ollama, base_url: {url}, timeout: {timeout}}}
  - {{name: b-llamacpp, type: llamacpp, base_url: {url}, timeout: {timeout}}}
  - name: b-tei
    type: tei
    base_url: {url}
    timeout: {timeout}
    embeddings: {{max_inputs_per_call: {tei_batch}, max_parallel_calls: 4}}
  - {{name: b-mock, type: mock}}
models:
  - {{name: gen, routes: [{{backend: b-mock, model: m}}]}}
"""
        + "".join(model(kind) for kind in EMBEDDERS)
        + auth
    )


@dataclass
class PoolingGateway:
    url: str
    app: web.Application
    upstream: PoolingUpstream


MakePooling = Callable[..., Awaitable[PoolingGateway]]


@pytest.fixture
async def pooling_upstream() -> AsyncIterator[PoolingUpstream]:
    up = PoolingUpstream()
    await up.start()
    try:
        yield up
    finally:
        await up.stop()


@pytest.fixture
async def make_pooling(pooling_upstream: PoolingUpstream) -> AsyncIterator[MakePooling]:
    runners: list[web.AppRunner] = []

    async def make(**options: Any) -> PoolingGateway:
        config = parse_config(pooling_config(pooling_upstream.url, **options), "<test config>", env={})
        app = create_app(config)
        runner, url = await serve_app(app)
        runners.append(runner)
        return PoolingGateway(url, app, pooling_upstream)

    try:
        yield make
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


@pytest.fixture
async def pooling(make_pooling: MakePooling) -> PoolingGateway:
    return await make_pooling()
