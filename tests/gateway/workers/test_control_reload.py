"""SIGHUP with ``--workers N``, piece by piece (no process tree; the whole of it:
tests/backends/vllm/pool/test_pool_gateway_workers_reload.py).

- the control process checks the file first: refused (YAML paths logged), nothing is forwarded;
- a gateway worker takes a changed pool section in place, refuses a restart key by name;
- the watch channel's barrier: a frame counts as seen only once every gateway worker said it applied it;
- a retiring vLLM worker waits for the gateway's calls (the shared table), not this process's.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.pool.client import VLLMPoolClient
from backends.vllm.pool.shared import PoolOwnership
from backends.vllm.pool.supervisor import Supervisor
from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.inflight import InFlightTable
from gateway.configfile import load_config
from gateway.workers.channel import read_frame, write_frame
from gateway.workers.pools import PoolWatchers
from gateway.workers.sighup import ControlReload

MODELS = "models: [{name: m, routes: [{backend: p, model: m}]}]\n"


def _pool(tmp_path: Path, **keys: str) -> str:
    settings = {"workers": "1", "log_dir": str(tmp_path / "logs"), "routing": "{strategy: round-robin}", **keys}
    inner = ", ".join(f"{k}: {v}" for k, v in settings.items())
    return f"backends:\n  - {{name: p, type: vllm-pool, model: m, command: [/nonexistent/vllm], {inner}}}\n"


class _Owner:
    """What ControlReload reads of PoolWatchers: the running pools (not started: no process)."""

    def __init__(self, pools: dict[str, Any]) -> None:
        self.owner = self
        self.pools = pools


async def test_the_control_process_forwards_nothing_it_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(_pool(tmp_path) + MODELS)
    started = load_config(path)
    pool = VLLMPoolBackend(started.backends[0])  # type: ignore[arg-type]
    forwarded: list[int] = []
    control = ControlReload(str(path), started, _Owner({"p": pool}), lambda: forwarded.append(1))  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="gateway.workers")

    path.write_text(_pool(tmp_path, no_such_key="1") + MODELS)  # invalid
    assert not await control.reload()
    path.write_text(_pool(tmp_path, timeout="{total: 5}") + MODELS)  # a key only a restart applies
    assert not await control.reload()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    # file:line:column: path: message (the form editors link)
    assert any(re.search(r"gw\.yaml:\d+:\d+: backends\[0\]\.no_such_key", e) for e in errors), errors
    assert any(re.search(r"gw\.yaml:\d+:\d+: backends\[0\]\.timeout: 'p': timeout changed", e) for e in errors), errors
    assert sum("nothing forwarded" in e for e in errors) == 2
    assert forwarded == [] and pool.config == started.backends[0]

    # A pool added: refused the same way (the control process starts pools only at start-up).
    added = "  - {name: q, type: vllm-pool, model: m, command: [/x], workers: 1, port_range: [50100, 50110]}\n"
    path.write_text(_pool(tmp_path) + added + MODELS)
    assert not await control.reload()
    assert any("backends[1]: vllm-pool backend 'q' is new" in r.getMessage() for r in caplog.records)
    assert forwarded == []

    # Valid, routing only: forwarded, and the pool takes it in place.
    path.write_text(_pool(tmp_path, routing="{strategy: least-load}") + MODELS)
    assert await control.reload()
    assert forwarded == [1] and pool.config.routing.strategy == "least-load"
    assert pool.last_rollout is not None and pool.last_rollout.outcome == "in_place"
    assert await control.reload() and forwarded == [1, 1]  # the same file again: nothing to roll
    assert pool.rollouts["in_place"] == 1


async def test_a_gateway_worker_takes_a_changed_pool_section_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from backends.registry import build_worker_backends
    from gateway.app import create_app
    from gateway.reload import enable_reload
    from gateway.state import STATE
    from gateway.workers.pools import same_pools

    path = tmp_path / "gw.yaml"
    path.write_text(_pool(tmp_path) + MODELS)
    started = load_config(path)
    built, _ = build_worker_backends(started.backends, 0)
    app = create_app(started, backends=built)
    reloader = enable_reload(app, path, adapt=lambda reloaded: same_pools(started, reloaded, str(path)))
    client = app[STATE].backends["p"]
    assert isinstance(client, VLLMPoolClient)
    caplog.set_level(logging.INFO, logger="gateway.reload")

    # New routing and new vllm_args: the client keeps serving (it starts nothing), with the new section.
    path.write_text(_pool(tmp_path, routing="{strategy: least-load}", vllm_args="[--x]") + MODELS)
    assert await reloader.reload()
    assert app[STATE].backends["p"] is client and client.config.vllm_args == ["--x"]
    assert client.dispatcher.balancer.routing.strategy == "least-load"
    infos = [r.getMessage() for r in caplog.records]
    assert any("applied here: routing; new vLLM workers from the control process for: vllm_args" in m for m in infos), (
        infos
    )

    # A key only a restart applies: refused by name, as in a single gateway.
    path.write_text(_pool(tmp_path, routing="{strategy: least-load}", vllm_args="[--x]", timeout="{total: 5}") + MODELS)
    assert not await reloader.reload()
    assert any("backends[0].timeout" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    await client.close()


async def test_synced_waits_for_every_gateway_worker_to_apply_the_frame() -> None:
    class Owner:
        def frame(self) -> dict[str, Any]:
            return {"pools": {}, "tables": {}}

    watchers = PoolWatchers(Owner())  # type: ignore[arg-type]
    ends = []
    tasks = []
    for _ in range(2):
        a, b = socket.socketpair()
        control_side = await asyncio.open_unix_connection(sock=a)
        worker_side = await asyncio.open_unix_connection(sock=b)
        tasks.append(asyncio.create_task(watchers.watch(*control_side)))
        ends.append(worker_side)
    for reader, _ in ends:
        assert (await read_frame(reader))["seq"] in (1, 2)  # each its first frame

    synced = asyncio.create_task(watchers.synced())
    seqs = [(await read_frame(reader))["seq"] for reader, _ in ends]
    assert seqs[0] == seqs[1]
    write_frame(ends[0][1], {"op": "applied", "seq": seqs[0]})
    await asyncio.sleep(0)
    for _ in range(20):  # many loop turns: still waiting for the second worker
        await asyncio.sleep(0)
    assert not synced.done()
    ends[1][1].close()  # a worker that hangs up waits for nothing
    await asyncio.wait_for(synced, 10)
    ends[0][1].close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_retired_vllm_worker_waits_for_the_gateway_workers_calls(tmp_path: Path) -> None:
    """The control process makes no call itself: its drain reads the gateway workers' column."""
    config = load_config_text(tmp_path, _pool(tmp_path) + MODELS)
    owner = PoolOwnership([config], 2, tmp_path)
    pool = VLLMPoolBackend(config)
    table = InFlightTable(tmp_path / "t", 2, 3, create=True)
    owner.pools["p"] = pool
    owner._tables["p"] = pool.in_flight_table = table
    barrier = asyncio.Event()

    async def synced() -> None:
        await barrier.wait()

    # What PoolOwnership.start sets on a pool it owns (without spawning anything).
    from backends.vllm.pool import shared

    pool.supervisor.in_flight_of = lambda ep: shared._gateway_in_flight(table, ep)
    pool.supervisor.drain_barrier = synced
    supervisor: Supervisor = pool.supervisor
    worker = type("W", (), {"endpoint": Endpoint(1, 8)})()
    table.cells[1 * 3 + 1] = 2  # gateway worker 1 has two calls on endpoint 1
    drained = asyncio.create_task(supervisor._drained(worker, 30))  # type: ignore[arg-type]
    for _ in range(5):
        await asyncio.sleep(0.03)
    assert not drained.done()  # no gateway worker has said it left routing yet
    barrier.set()
    for _ in range(5):
        await asyncio.sleep(0.03)
    assert not drained.done()  # its calls are still in flight
    table.cells[1 * 3 + 1] = 0
    await asyncio.wait_for(drained, 10)
    assert shared._gateway_in_flight(table, Endpoint(7, 8)) == 1  # past the columns: taken as busy


def load_config_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "one.yaml"
    path.write_text(text)
    return load_config(path).backends[0]
