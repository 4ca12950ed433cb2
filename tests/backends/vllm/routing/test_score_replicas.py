"""``strategy: score`` with KV events, two gateway replicas over two stand-in engines
(``tests/backends/vllm/pool/standin_engine.py``: vLLM's block hashes, KV events over ZMQ, vLLM's
metrics): both replicas send each prompt to the same server, and a prompt a server cached behind
their back goes to that server from either replica (no replica-local learning)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.pool.conftest import wait_for
from tests.conftest import free_port, serve_app

pytest.importorskip("zmq")
tokenizers = pytest.importorskip("tokenizers")

ENGINE = Path(__file__).resolve().parents[1] / "pool" / "standin_engine.py"
HOSTS = ("127.0.0.1", "127.0.0.2")  # one loopback address each, so both publish on one port number


def word(i: int) -> str:
    return f"w{i}"


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[Path, list[str], int]]:
    vocab = {"[UNK]": 0} | {word(i): i + 1 for i in range(512)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    events = free_port()
    procs, urls = [], []
    for host in HOSTS:
        port = free_port()
        cfg = json.dumps({"endpoint": f"tcp://{host}:{events}", "topic": "kv"})
        cmd = [sys.executable, str(ENGINE), str(tmp_path), "--host", host, "--port", str(port)]
        cmd += ["--served-model-name", "m", "--kv-events-config", cfg, "--engine-step-ms", "1"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        urls.append(f"http://{host}:{port}")
    try:
        for url in urls:
            for _ in range(200):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.05)
        yield tmp_path, urls, events
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def yaml(model: Path, urls: list[str], events: int) -> str:
    return f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: v
    type: vllm
    base_urls: {json.dumps([u + "/v1" for u in urls])}
    routing:
      strategy: score
      tokenizer: {json.dumps(str(model))}
      kv_events: {{endpoint: "tcp://{{host}}:{events}", topic: kv}}
      metrics_interval: 0.05
      block_chars: 64
      max_blocks: 64
models:
  - name: m
    routes: [{{backend: v, model: m}}]
"""


async def ask(session: aiohttp.ClientSession, url: str, prompt: str) -> str:
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}) as r:
        assert r.status == 200, await r.text()
        text: str = (await r.json())["choices"][0]["text"]
        return text.split()[0]  # w<port> of the server that answered


def held(backend: Any) -> int:
    """The KV-cache blocks this replica has learned its servers hold."""
    return sum(len(ep.blocks) for ep in backend.dispatcher.endpoints)


async def learned(backends: list[Any], before: list[int], what: str, within: float = 10.0) -> None:
    """Wait until every replica has read the servers' events for blocks stored since ``before``: a
    server publishes them before its first token, but they reach each replica on their own socket."""
    await wait_for(lambda: all(held(b) > n for b, n in zip(backends, before, strict=True)), within, what)


async def subscribed(session: aiohttp.ClientSession, urls: list[str], backends: list[Any]) -> None:
    """Wait until every replica reads every server's events. A ZMQ subscriber misses what is published
    before it has connected, so each server is sent warm-up prompts (their own prefixes, which no test
    prompt shares) until each replica has learned the blocks of one."""
    for n, url in enumerate(urls):
        for attempt in range(50):
            before = [held(b) for b in backends]
            body = {"model": "m", "prompt": prompt(200 + 50 * n + attempt), "max_tokens": 1}
            async with session.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200
            try:
                await learned(backends, before, f"{url}'s events", within=0.5)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError(f"the replicas never read {url}'s events")


def prompt(tenant: int, n: int = 60) -> str:
    return " ".join(word((tenant * 37 + i * 11) % 512) for i in range(n))


async def test_replicas_score_alike_and_follow_the_servers_events(engines: tuple[Path, list[str], int]) -> None:
    model, urls, events = engines
    apps = [create_app(parse_config(yaml(model, urls, events), "<replica>", env={})) for _ in range(2)]
    served = [await serve_app(app) for app in apps]
    try:
        from gateway.state import STATE

        backends = [app[STATE].backends["v"] for app in apps]
        await wait_for(
            lambda: all(ep.load.block_size == 16 for b in backends for ep in b.dispatcher.endpoints), 10, "scraped"
        )
        async with aiohttp.ClientSession() as session:
            await subscribed(session, urls, backends)
            # 1. Fresh prompts, one replica after the other: the same server each time.
            for tenant in range(6):
                before = [held(b) for b in backends]
                a = await ask(session, served[0][1], prompt(tenant))
                await learned(backends, before, f"tenant {tenant}'s blocks")
                b = await ask(session, served[1][1], prompt(tenant) + " w1 w2")
                assert a == b, tenant
            # 2. A prompt cached on the second server behind the gateways' backs goes there from both.
            target = urls[1]
            body = {"model": "m", "prompt": prompt(99), "max_tokens": 1}
            before = [held(b) for b in backends]
            async with session.post(target + "/v1/completions", json=body) as r:
                assert r.status == 200
            port = target.rsplit(":", 1)[1]
            await learned(backends, before, "the blocks cached behind the gateways' backs")
            for _, url in served:
                assert await ask(session, url, prompt(99) + " w7") == f"w{port}"
        statuses = [b.pool_status() for b in backends]
        for status in statuses:
            assert status.scoring["prefix"] == "kv-events" and status.scoring["scored_kv_events"] >= 1
            assert sum(w.prefix_blocks for w in status.workers) > 0
        # Fresh prompts go by their rendezvous choice (no server holds them); the second replica's
        # longer prompts and the cached one by the blocks the servers hold.
        assert sum(s.scoring["scored_kv_events"] for s in statuses) >= 8
    finally:
        for runner, _ in served:
            await runner.cleanup()


async def test_a_session_header_keeps_a_conversation_on_its_server(engines: tuple[Path, list[str], int]) -> None:
    from backends.vllm.routing.rendezvous import rendezvous_first
    from backends.vllm.routing.score import session_key
    from gateway.state import STATE

    model, urls, events = engines
    app = create_app(parse_config(yaml(model, urls, events), "<session>", env={}))
    runner, url = await serve_app(app)
    try:
        eps = app[STATE].backends["v"].dispatcher.endpoints
        await wait_for(lambda: all(ep.load.block_size == 16 for ep in eps), 10, "scraped")
        home = rendezvous_first(eps, session_key("conversation-7")).url.removesuffix("/v1").rsplit(":", 1)[1]
        async with aiohttp.ClientSession(headers={"x-session-id": "conversation-7"}) as session:
            answered = {await ask(session, url, prompt(tenant)) for tenant in range(8)}
        assert answered == {f"w{home}"}
        async with aiohttp.ClientSession() as session:  # no session: each prompt by its prefix (1 in 32768 on one)
            assert len({await ask(session, url, prompt(tenant + 100)) for tenant in range(16)}) == 2
        assert app[STATE].backends["v"].dispatcher.balancer.decisions["score_session"] == 8
    finally:
        await runner.cleanup()
