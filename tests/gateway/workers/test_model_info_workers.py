"""What vLLM's ``GET /v1/models`` reports (``max_model_len``, ``root``) is known to every worker of
``gateway serve --workers 2``, as to a single-process gateway: for a ``vllm`` backend over one
``base_url`` (each worker starts its own adapter), over ``base_urls`` and for a ``vllm-pool`` (the
control process learns it and its frames carry it to the workers). Both workers list it in
``/v1/models`` and both refuse, with Responses' ``truncation: disabled``, a conversation over the
window; still so after a worker is killed and restarted and after a SIGHUP reload.

A real process tree, a real ``redis-server`` (the conversation store two workers share) and a
vLLM-shaped upstream in this process (the pool's worker is ``sim_vllm_worker.py``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.conftest import free_port, port_range
from tests.e2e.model_upstreams import SimulatedUpstream
from tests.gateway.security.conftest import RedisServer
from tests.gateway.workers.procs import kill_a_worker, stop_gateway

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "e2e" / "sim_vllm_worker.py"
WINDOWS = {"m-one": 2000, "m-many": 2000, "m-pool": 1500}  # max_model_len each upstream reports
ROOTS = {"m-one": "/models/up", "m-many": "/models/up", "m-pool": "pool-weights"}
LONG = "lorem ipsum dolor sit amet " * 200  # ~5,400 characters: ~1,350 tokens a turn


class VLLMShaped(SimulatedUpstream):
    """The simulated vLLM chat server, its ``/v1/models`` as vLLM writes it and an empty ``/metrics``."""

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == "/v1/models":
            entry = {"id": "up", "object": "model", "root": "/models/up", "max_model_len": WINDOWS["m-one"]}
            return web.json_response({"object": "list", "data": [entry]})
        if request.path == "/metrics":
            return web.Response(text="", content_type="text/plain")
        return await super()._get(request)


def _config(port: int, base_url: str, redis: str, prefix: str) -> str:
    low, high = port_range(41)  # free now, not a fixed guess: other pytest processes share the machine
    pool = {
        "name": "pool", "type": "vllm-pool", "model": "pool-weights", "served_model_name": "up-pool",
        "command": [sys.executable, str(WORKER)], "vllm_args": ["--max-model-len", str(WINDOWS["m-pool"])],
        "port_range": [low, high], "workers": 1, "startup_timeout": 30, "stop_timeout": 2,
        "routing": {"wait_for_ready": 30},
    }  # fmt: skip
    return f"""
server: {{host: 127.0.0.1, port: {port}, drain_timeout: 5}}
backends:
  - {{name: one, type: vllm, base_url: {base_url}}}
  - {{name: many, type: vllm, base_urls: [{base_url}]}}
  - {json.dumps(pool)}
models:
  - {{name: m-one, routes: [{{backend: one, model: up}}]}}
  - {{name: m-many, routes: [{{backend: many, model: up}}]}}
  - {{name: m-pool, routes: [{{backend: pool, model: up-pool}}]}}
responses: {{store: '{redis}', store_prefix: {prefix}}}
"""


@asynccontextmanager
async def _serve(tmp_path: Path, config: str, port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    path = tmp_path / "gw.yaml"
    path.write_text(config)
    with (tmp_path / "gateway.err").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2", cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        yield proc
    finally:
        await stop_gateway(proc)


async def _on_both(
    proc: asyncio.subprocess.Process, session: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> dict[str, tuple[int, Any]]:
    """The same request over fresh connections until both workers answered (and the pool serves):
    worker's request-id prefix -> (status, body)."""
    seen: dict[str, tuple[int, Any]] = {}
    deadline = time.monotonic() + 90
    while len(seen) < 2:
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, f"both workers did not answer {method} {url}: {seen}"
        try:
            async with session.request(method, url, json=body, headers={"Connection": "close"}) as resp:
                answer = await resp.json()
                if resp.status >= 500:  # the pool's worker not ready yet
                    await asyncio.sleep(0.2)
                    continue
                seen[resp.headers["x-request-id"][:16]] = (resp.status, answer)
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)
    return seen


async def _pool_serves_on_both(proc: asyncio.subprocess.Process, session: aiohttp.ClientSession, url: str) -> None:
    """Until both workers answered a call through the pool: a worker routes to the pool's server only
    once a view said it is ready, and that view carries what its ``/v1/models`` said. Before, the
    window is unknown (the server has not answered yet) and ``m-pool`` is listed without it."""
    call = {"model": "m-pool", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for status, answer in (await _on_both(proc, session, "POST", url + "/v1/chat/completions", call)).values():
        assert status == 200, answer


def _reloads(log: Path) -> int:
    """How many times the workers logged a reload applied (a few KB of log: read whole)."""
    return log.read_bytes().count(b"config reload applied")


async def _reloaded(proc: asyncio.subprocess.Process, log: Path, before: int, within: float = 60) -> None:
    """Until both workers logged the reload applied (each swaps in its rebuilt backends, then logs)."""
    deadline = time.monotonic() + within
    while _reloads(log) < before + 2:
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, "the workers did not apply the reload"
        await asyncio.sleep(0.1)


async def _check_both_workers(proc: asyncio.subprocess.Process, session: aiohttp.ClientSession, url: str) -> None:
    await _pool_serves_on_both(proc, session, url)
    for status, listing in (await _on_both(proc, session, "GET", url + "/v1/models")).values():
        assert status == 200
        by_id = {m["id"]: m for m in listing["data"]}
        for model, window in WINDOWS.items():
            assert by_id[model].get("max_model_len") == window, by_id[model]
            assert by_id[model].get("root") == ROOTS[model], by_id[model]
    for model, window in WINDOWS.items():
        first = {"model": model, "input": "1 " + LONG, "max_output_tokens": 8}
        async with session.post(url + "/v1/responses", json=first) as resp:
            answer = await resp.json()
            assert resp.status == 200, answer
        turn = {**first, "input": "2 " + LONG, "previous_response_id": answer["id"], "truncation": "disabled"}
        for status, refused in (await _on_both(proc, session, "POST", url + "/v1/responses", turn)).values():
            assert status == 400, refused
            assert refused["error"]["code"] == "context_length_exceeded" and refused["error"]["param"] == "input"
            assert f"context window of {window} tokens" in refused["error"]["message"]


async def test_every_worker_knows_the_context_window_across_a_restart_and_a_reload(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    upstream = VLLMShaped("vllm")
    await upstream.start()
    port = free_port()
    config = _config(port, upstream.base_url, redis_server.url, f"mi{time.monotonic_ns()}")
    url = f"http://127.0.0.1:{port}"
    try:
        async with _serve(tmp_path, config, port) as proc, aiohttp.ClientSession() as session:
            await _check_both_workers(proc, session, url)

            await kill_a_worker(proc)
            await _check_both_workers(proc, session, url)

            # A reload that rebuilds the one-server backend in every worker (a new adapter, started there).
            (tmp_path / "gw.yaml").write_text(config.replace("base_url: ", "max_concurrency: 50, base_url: ", 1))
            log = tmp_path / "gateway.err"
            before = _reloads(log)
            proc.send_signal(signal.SIGHUP)
            await _reloaded(proc, log, before)
            await _check_both_workers(proc, session, url)
    finally:
        await upstream.stop()
