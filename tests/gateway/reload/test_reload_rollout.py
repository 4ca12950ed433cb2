"""SIGHUP with a changed ``vllm-pool`` section, under steady load, over stand-in workers (issue 15):
the pool's workers are replaced one at a time with no failed request; a new worker that never
gets ready stops the rollout, the old workers keep serving, and the failure shows in the log
(with the YAML path), ``status.json`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.routing.status import read_status
from gateway.app import create_app
from gateway.configfile import load_config
from gateway.reload import Reloader, enable_reload
from gateway.state import STATE
from tests.backends.vllm.pool.conftest import gateway_yaml, pool_yaml, port_range, wait_no_pids, worker_info
from tests.conftest import eventually, serve_app
from tests.keepalive_load import load

CLIENTS = 6


@pytest.fixture
def tag() -> Iterator[str]:
    """Marks this test's worker processes; none may be left at the end."""
    value = f"pooltest-{uuid.uuid4().hex[:12]}"
    yield value
    assert not wait_no_pids(value)


@dataclass
class Gateway:
    url: str
    pool: VLLMPoolBackend
    reloader: Reloader
    write: Callable[..., None]


@asynccontextmanager
async def _gateway(tag: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    ports = port_range()
    path = tmp_path / "gateway.yaml"

    def write(**keys: object) -> None:
        keys.setdefault("workers", 2)
        keys.setdefault("routing", "{strategy: round-robin, metrics_interval: 0.05, wait_for_ready: 10}")
        # Streams last a while (4 tokens x 20 ms), so a worker is retired with calls in flight.
        args = ("--standin-token-delay", "0.02", *keys.pop("extra_args", ()))  # type: ignore[misc]
        text = pool_yaml(tag, tmp_path / "logs", ports=ports, extra_args=args, **keys)  # type: ignore[arg-type]
        path.write_text(gateway_yaml(text))

    write()
    app = create_app(load_config(path))
    reloader = enable_reload(app, path)
    runner, url = await serve_app(app)
    try:
        pool = app[STATE].backends["pool"]
        assert isinstance(pool, VLLMPoolBackend)
        await eventually(lambda: all(w.state == "ready" for w in pool.supervisor.workers))
        yield Gateway(url, pool, reloader, write)
    finally:
        await runner.cleanup()


def _live(pool: VLLMPoolBackend) -> list[int]:
    return [w.status().pid or 0 for w in pool.supervisor.workers if w.status().pid]


async def _rollouts(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'gateway_pool_rollouts_total\{backend="pool",outcome="(\w+)"\} ([0-9.e+]+)', text)
    }


async def test_sighup_rolls_the_pool_one_worker_at_a_time_under_load(tag: str, tmp_path: Path) -> None:
    async with _gateway(tag, tmp_path) as gw:
        old = set(_live(gw.pool))
        assert len(old) == 2
        seen: list[int] = []  # live worker processes, looked at every 10 ms

        async def watch() -> None:
            while True:
                seen.append(len(_live(gw.pool)))
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        async with load(gw.url, CLIENTS) as tally:
            await eventually(lambda: tally.ok >= 20)
            gw.write(extra_args=("--rollout", "2"))
            os.kill(os.getpid(), signal.SIGHUP)
            await eventually(lambda: gw.pool.last_rollout is not None, within=60)
            before = tally.ok
            await eventually(lambda: tally.ok >= before + 20)
        watcher.cancel()
        report = gw.pool.last_rollout
        assert report is not None and (report.outcome, report.started, report.retired) == ("rolled", 2, 2)
        assert tally.failures == [] and tally.ok > 40
        assert max(seen) <= 3  # at most one worker replaced at a time
        live = set(_live(gw.pool))
        assert len(live) == 2 and not live & old  # every old process gone, two new ones
        async with aiohttp.ClientSession() as session:
            for w in gw.pool.supervisor.workers:
                assert w.state == "ready" and w.port is not None
                info = await worker_info(session, w.port)
                assert "--rollout" in info["argv"] and info["requests"] > 0  # serving
        assert gw.reloader.reloads == 1 and (await _rollouts(gw.url)).get("rolled") == 1


async def test_a_new_worker_that_never_gets_ready_stops_the_rollout(
    tag: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.reload")
    async with _gateway(tag, tmp_path) as gw:
        old = sorted(_live(gw.pool))
        async with load(gw.url, CLIENTS) as tally:
            await eventually(lambda: tally.ok >= 20)
            gw.write(extra_args=("--standin-crash-at-start", "3"))
            assert await gw.reloader.reload()
            before = tally.ok
            await eventually(lambda: tally.ok >= before + 20)
        assert tally.failures == []
        assert sorted(_live(gw.pool)) == old and all(w.state == "ready" for w in gw.pool.supervisor.workers)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("gateway.yaml: backends[0]" in e and "rollout failed" in e for e in errors), errors
        status = read_status(gw.pool.status_path)
        assert status.rollout is not None and status.rollout["outcome"] == "failed"
        assert "exited with status 3" in status.rollout["error"]
        assert (await _rollouts(gw.url)).get("failed") == 1

        gw.write(extra_args=("--fixed",))  # the next reload rolls it out
        assert await gw.reloader.reload()
        assert gw.pool.last_rollout is not None and gw.pool.last_rollout.outcome == "rolled"
        assert not set(_live(gw.pool)) & set(old)


async def test_a_routing_change_restarts_no_process(tag: str, tmp_path: Path) -> None:
    async with _gateway(tag, tmp_path) as gw:
        pids = _live(gw.pool)
        gw.write(routing="{strategy: least-load, metrics_interval: 0.05, wait_for_ready: 10}")
        async with load(gw.url, CLIENTS) as tally:
            await eventually(lambda: tally.ok >= 10)
            assert await gw.reloader.reload()
            before = tally.ok
            await eventually(lambda: tally.ok >= before + 10)
        assert tally.failures == [] and _live(gw.pool) == pids
        assert gw.pool.dispatcher.balancer.routing.strategy == "least-load"
        assert gw.pool.dispatcher.balancer.decisions["least_load"] > 0
