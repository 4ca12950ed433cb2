"""Two ``gateway serve`` processes (replicas) with ``prefix-hash`` in front of the same vLLM
stand-ins send each prefix to the same server, without sharing any state.

The replicas list the servers in different orders and start with different hash seeds
(``PYTHONHASHSEED``), so agreement comes only from the stable key and rendezvous hashing.
With ``prefix-affinity`` each replica would learn its own map (first come, least loaded).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.backends.vllm.pool.conftest import MODEL
from tests.backends.vllm.pool.standin_worker import build_app, parse_args
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[4]
PORT = re.compile(r" w(\d+)")


def replica_config(urls: list[str]) -> str:
    return f"""
server: {{host: 127.0.0.1, port: 0, drain_timeout: 2}}
backends:
  - name: fleet
    type: vllm
    base_urls: [{", ".join(urls)}]
    routing: {{strategy: prefix-hash, block_chars: 16, metrics_interval: 0.1, wait_for_ready: 5}}
    probe: {{interval: 0.1, timeout: 1, failures: 2}}
    timeout: {{connect: 1, first_byte: 5, total: 10, stream_idle: 5}}
models:
  - name: m
    routes: [{{backend: fleet, model: {MODEL}}}]
"""


@pytest.fixture
async def servers() -> AsyncIterator[list[int]]:
    """Three stand-in vLLM servers in this process; the replicas reach them over loopback."""
    ports = [free_port() for _ in range(3)]
    runners = []
    for port in ports:
        runner = web.AppRunner(build_app(parse_args([MODEL, "--port", str(port)])), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    yield ports
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def start_replica(tmp_path: Path) -> Iterator[Callable[[list[str], str], str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(urls: list[str], seed: str) -> str:
        n = len(procs)
        config = tmp_path / f"replica{n}.yaml"
        config.write_text(replica_config(urls))
        port = free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
                cwd=ROOT,
                env={**os.environ, "PYTHONHASHSEED": seed},
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / f"replica{n}.log", "wb"),
            )
        )
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_ready(session: aiohttp.ClientSession, url: str, log: Path) -> None:
    """Until ``/ready`` says 200 (the replica listens and has a server); the log on timeout."""
    deadline = time.monotonic() + 30
    while True:
        try:
            async with session.get(url + "/ready") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"replica not ready in 30 s; see {log}")
        await asyncio.sleep(0.05)


async def served_by(session: aiohttp.ClientSession, url: str, prompt: str) -> int:
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}) as r:
        text = await r.text()
        assert r.status == 200, text
    match = PORT.search(text)
    assert match, text
    return int(match.group(1))


async def test_two_replicas_send_each_prefix_to_the_same_server(
    servers: list[int], start_replica: Callable[[list[str], str], str], tmp_path: Path
) -> None:
    urls = [f"http://127.0.0.1:{p}/v1" for p in servers]
    a = start_replica(urls, "1")
    b = start_replica(list(reversed(urls)), "2")
    # The key is the first block (16 chars here): the groups differ inside it. 48 groups miss
    # one of 3 servers with probability 3 x (2/3)^48 (1e-8).
    groups = [f"{g:02d} system prompt ".ljust(48, ".") for g in range(48)]
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, a, tmp_path / "replica0.log")
        await wait_ready(session, b, tmp_path / "replica1.log")
        via_a = [await served_by(session, a, g + f"question {i} from a") for i, g in enumerate(groups)]
        via_b = [await served_by(session, b, g + f"another question {i} from b") for i, g in enumerate(groups)]
        again_a = [await served_by(session, a, g + "a follow-up") for g in groups]
    assert via_a == via_b == again_a  # every prefix lands on one server, whichever replica routed it
    assert set(via_a) == set(servers)  # and the prefixes spread over all servers
