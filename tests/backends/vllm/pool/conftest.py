"""Pool test helpers: stand-in worker configs with short timings, and the no-orphan check.

Every test that spawns workers gets a unique ``tag`` that appears on the command line of
every process it starts (launcher, stand-in, the stand-in's "engine" child); teardown
scans /proc and fails if any of them is still alive (zombies excepted).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from backends.vllm.pool import VLLMPoolBackend
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from schemas.config import VLLMPoolBackendConfig
from tests.conftest import port_range as port_range  # re-exported: pool tests import it from here
from tests.conftest import serve_app

STANDIN = str(Path(__file__).with_name("standin_worker.py"))
MODEL = "standin-model"


def live_pids_with(tag: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``tag``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if tag.encode() in cmdline and stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_no_pids(tag: str, within: float = 8.0) -> list[int]:
    deadline = time.monotonic() + within
    while (left := live_pids_with(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique marker for this test's processes; teardown asserts none of them is left."""
    value = f"pooltest-{uuid.uuid4().hex[:12]}"
    yield value
    left = wait_no_pids(value)
    assert not left, f"processes left behind: {left}"


def pool_yaml(
    tag: str,
    log_dir: Path,
    *,
    name: str = "pool",
    extra_args: tuple[str, ...] = (),
    ports: tuple[int, int] | None = None,
    **keys: Any,
) -> str:
    """One ``vllm-pool`` backend entry (indented as a list item) with fast test timings."""
    lo, hi = ports or port_range()
    args = ["--standin-tag", tag, *extra_args]
    settings: dict[str, Any] = {
        "workers": 1,
        "startup_timeout": 10,
        "stop_timeout": 2,
        "probe": "{interval: 0.05, timeout: 1, failures: 3}",
        "restart": "{backoff_initial: 0.05, backoff_max: 0.4, max_failures: 3}",
        "routing": "{metrics_interval: 0.05, wait_for_ready: 10}",
        "timeout": "{connect: 1, first_byte: 10, total: 20, stream_idle: 10}",
    }
    settings.update(keys)
    lines = [
        f"  - name: {name}",
        "    type: vllm-pool",
        f"    model: {MODEL}",
        f"    command: {json.dumps([sys.executable, STANDIN])}",
        f"    vllm_args: {json.dumps(args)}",
        f"    port_range: [{lo}, {hi}]",
        f"    log_dir: {log_dir}",
    ]
    lines += [f"    {key}: {value}" for key, value in settings.items() if value is not None]
    return "\n".join(lines) + "\n"


def gateway_yaml(backends: str, *, model_routes: str | None = None, server: str = "") -> str:
    routes = model_routes or f"[{{backend: pool, model: {MODEL}}}]"
    return (
        "server: {host: 127.0.0.1, port: 0" + (", " + server if server else "") + "}\n"
        f"backends:\n{backends}models:\n  - name: m\n    routes: {routes}\n"
    )


def pool_config(tag: str, log_dir: Path, **keys: Any) -> VLLMPoolBackendConfig:
    config = parse_config(gateway_yaml(pool_yaml(tag, log_dir, **keys)), "<pool test>", env={})
    backend = config.backends[0]
    assert isinstance(backend, VLLMPoolBackendConfig)
    return backend


async def wait_for(predicate: Callable[[], bool], within: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def states(pool: VLLMPoolBackend) -> list[str]:
    return [w.state for w in pool.supervisor.workers]


MakePool = Callable[..., Awaitable[VLLMPoolBackend]]


@pytest.fixture
async def make_pool(tag: str, tmp_path: Path) -> AsyncIterator[MakePool]:
    """``await make_pool(**pool_yaml keys)`` -> a started pool; closed (workers stopped) at teardown."""
    pools: list[VLLMPoolBackend] = []

    async def make(**keys: Any) -> VLLMPoolBackend:
        pool = VLLMPoolBackend(pool_config(tag, tmp_path / f"logs{len(pools)}", **keys))
        await pool.start()
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            await pool.close()


async def worker_info(session: aiohttp.ClientSession, port: int) -> dict[str, Any]:
    async with session.get(f"http://127.0.0.1:{port}/standin/info") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def control(session: aiohttp.ClientSession, port: int, **body: Any) -> None:
    async with session.post(f"http://127.0.0.1:{port}/standin/control", json=body) as resp:
        assert resp.status == 200


@dataclass
class PoolGateway:
    url: str
    app: web.Application
    pool: VLLMPoolBackend
    config_path: Path


MakePoolGateway = Callable[..., Awaitable[PoolGateway]]


@pytest.fixture
async def make_pool_gateway(tag: str, tmp_path: Path) -> AsyncIterator[MakePoolGateway]:
    """``await make_pool_gateway(**pool_yaml keys)``: a gateway (create_app, as ``gateway serve``)
    whose model ``m`` routes to one ``vllm-pool`` backend of stand-ins."""
    runners: list[web.AppRunner] = []

    async def make(server: str = "", **keys: Any) -> PoolGateway:
        text = gateway_yaml(pool_yaml(tag, tmp_path / f"logs{len(runners)}", **keys), server=server)
        config_path = tmp_path / f"gateway{len(runners)}.yaml"
        config_path.write_text(text)
        app = create_app(parse_config(text, str(config_path), env={}))
        runner, url = await serve_app(app)
        runners.append(runner)
        pool = app[STATE].backends["pool"]
        assert isinstance(pool, VLLMPoolBackend)
        return PoolGateway(url, app, pool, config_path)

    try:
        yield make
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
