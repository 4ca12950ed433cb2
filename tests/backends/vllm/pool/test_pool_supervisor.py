"""Supervision with stand-in workers: spawn, GPUs, readiness, restart, give-up, stop."""

from __future__ import annotations

import json
import logging
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from backends.base import UpstreamCall
from backends.vllm.adapter import VLLMBackend
from backends.vllm.pool import VLLMPoolBackend, resources
from backends.vllm.routing import NoReadyWorkerError
from backends.vllm.routing.status import read_status
from schemas.completions import CompletionRequest
from tests.backends.vllm.pool.conftest import MODEL, MakePool, control, live_pids_with, states, wait_for, worker_info
from tests.conftest import port_range


def call(prompt: str = "hello", **fields: object) -> UpstreamCall:
    request = CompletionRequest.model_validate({"model": "m", "prompt": prompt, "max_tokens": 3, **fields})
    return UpstreamCall(request, MODEL, "m", "req-test")


async def ready(pool: VLLMPoolBackend, n: int | None = None) -> None:
    count = n if n is not None else len(pool.supervisor.workers)
    await wait_for(lambda: states(pool).count("ready") >= count, what=f"{count} ready worker(s): {states(pool)}")


async def test_workers_get_their_gpus_ports_and_logs(make_pool: MakePool, tag: str) -> None:
    lo, hi = port_range()  # free now: a fixed range collides with other pytest processes on the machine
    pool = await make_pool(gpus="[0, 1, 2, 3]", tensor_parallel_size=2, workers=None, ports=(lo, hi))
    assert [w.gpus for w in pool.supervisor.workers] == [[0, 1], [2, 3]]
    await ready(pool)
    async with aiohttp.ClientSession() as session:
        infos = [await worker_info(session, w.port or 0) for w in pool.supervisor.workers]
    assert [i["cuda_visible_devices"] for i in infos] == ["0,1", "2,3"]
    ports = [w.port for w in pool.supervisor.workers]
    assert len(set(ports)) == 2 and all(p is not None and lo <= p <= hi for p in ports)
    events = []
    for info in infos:
        argv = info["argv"]
        assert argv[0] == MODEL
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert argv[argv.index("--port") + 1] == str(info["port"])
        # strategy: score, prefix: kv-events (the defaults): each worker publishes on a socket of its own.
        events.append(json.loads(argv[argv.index("--kv-events-config") + 1]))
    assert [e["endpoint"] for e in events] == [w.endpoint.events for w in pool.supervisor.workers]
    assert all(e["endpoint"].startswith("ipc://") and e["enable_kv_cache_events"] for e in events)
    assert len({e["endpoint"] for e in events}) == 2
    for w in pool.supervisor.workers:
        assert "standin ready" in w.log_path.read_text()
        assert w.process is not None and w.process.pid in live_pids_with(tag)
    status = read_status(pool.status_path)
    assert [w.state for w in status.workers] == ["ready", "ready"]
    assert [w.gpus for w in status.workers] == [[0, 1], [2, 3]]
    result = await pool.complete(call())
    assert b'"text"' in result.body
    # Each worker's adapter read its vLLM version; the pool takes the capabilities it found.
    adapter = pool.dispatcher.endpoints[0].adapter
    assert isinstance(adapter, VLLMBackend) and str(adapter.version) == "0.32.0"
    assert pool.capabilities is adapter.capabilities


async def test_a_stranger_on_the_port_is_not_taken_for_the_worker(
    make_pool: MakePool, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 20's race: another program binds a port of the range after the pool's bind probe
    # found it free, and answers /health and /v1/models like a worker would.
    lo, hi = port_range(2)

    async def health(_: web.Request) -> web.Response:
        return web.Response()

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL}]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", lo).start()
    try:
        monkeypatch.setattr(resources, "_bindable", lambda host, port: True)  # probed before the stranger bound
        pool = await make_pool(ports=(lo, hi))
        worker = pool.supervisor.workers[0]
        await ready(pool)
        # Its stand-in could not bind lo and exited; restarted on the next port, it is ready there.
        assert worker.port == hi and worker.restarts >= 1
        async with aiohttp.ClientSession() as session:
            info = await worker_info(session, hi)
        assert info["pid"] in live_pids_with(tag)
    finally:
        await runner.cleanup()


async def test_no_free_port_fails_the_worker_cleanly(make_pool: MakePool) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        pool = await make_pool(ports=(port, port))
        worker = pool.supervisor.workers[0]
        await wait_for(lambda: worker.state == "failed", what="failed")
    assert f"no free port in {port}-{port}" in (worker.last_error or "")
    with pytest.raises(NoReadyWorkerError):
        await pool.complete(call())


async def test_not_ready_until_models_lists_the_model(make_pool: MakePool) -> None:
    pool = await make_pool(
        extra_args=("--standin-list-model", "something-else"),
        routing="{metrics_interval: 0.05, wait_for_ready: 0.3}",
    )
    await wait_for(lambda: pool.supervisor.workers[0].last_error is not None, what="a readiness verdict")
    assert states(pool) == ["starting"]
    assert "does not list 'standin-model'" in (pool.supervisor.workers[0].last_error or "")
    started = time.monotonic()
    with pytest.raises(NoReadyWorkerError) as info:
        await pool.complete(call())
    assert time.monotonic() - started >= 0.25  # it waited (bounded) for a ready worker
    assert info.value.status == 503 and info.value.retry_after is not None and info.value.retryable


async def test_requests_wait_for_a_slow_start(make_pool: MakePool) -> None:
    pool = await make_pool(extra_args=("--standin-startup-delay", "0.8"))
    started = time.monotonic()
    result = await pool.complete(call())
    assert time.monotonic() - started >= 0.7
    assert b" w" in result.body
    assert states(pool) == ["ready"]


async def test_crashed_worker_restarts_with_backoff(make_pool: MakePool) -> None:
    pool = await make_pool(restart="{backoff_initial: 0.2, backoff_max: 5, max_failures: 5}")
    await ready(pool)
    worker = pool.supervisor.workers[0]
    async with aiohttp.ClientSession() as session:
        for n, delay in ((1, 0.2), (2, 0.4)):
            old_pid = worker.process.pid if worker.process else None
            await control(session, worker.port or 0, crash=7)
            await wait_for(lambda: worker.state == "backoff", what="backoff")
            await ready(pool)
            assert worker.process is not None and worker.process.pid != old_pid
            assert (worker.restarts, worker.failures, worker.last_exit) == (n, n, 7)
            times = dict((state, t) for t, state in list(worker.transitions)[-3:])
            assert times["starting"] - times["backoff"] >= delay * 0.9
    assert worker.endpoint.generation == 3  # each ready spell is a new generation (fresh prefix LRU)


async def test_crash_loop_gives_up_and_reports(make_pool: MakePool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gateway.pool")
    pool = await make_pool(extra_args=("--standin-crash-at-start", "3"))
    worker = pool.supervisor.workers[0]
    await wait_for(lambda: worker.state == "failed", what="failed")
    assert (worker.failures, worker.restarts, worker.last_exit) == (3, 2, 3)
    assert any("CUDA out of memory" in line for line in worker.log_tail)
    assert "exited with status 3" in (worker.last_error or "")
    gave_up = [r for r in caplog.records if "giving up" in r.getMessage()]
    assert gave_up and "CUDA out of memory" in gave_up[0].getMessage()
    # Nothing can become ready: refuse at once, not after wait_for_ready.
    started = time.monotonic()
    with pytest.raises(NoReadyWorkerError) as info:
        await pool.complete(call())
    # Timing-only sanity (the supervisor runs real processes on real time): refused well
    # before wait_for_ready's 30 s default would have passed.
    assert time.monotonic() - started < 10.0
    assert info.value.retry_after == 30.0
    status = read_status(pool.status_path)
    assert status.workers[0].state == "failed" and status.workers[0].log_tail


async def test_failed_starts_then_recovers(make_pool: MakePool, tmp_path: object) -> None:
    state_file = f"{tmp_path}/starts"
    pool = await make_pool(extra_args=("--standin-fail-starts", "2", "--standin-state", state_file))
    await ready(pool)
    worker = pool.supervisor.workers[0]
    assert (worker.restarts, worker.failures) == (2, 2)


async def test_hung_worker_is_killed_and_replaced(make_pool: MakePool, tag: str) -> None:
    pool = await make_pool(stop_timeout=0.5, probe="{interval: 0.05, timeout: 0.2, failures: 3}")
    await ready(pool)
    worker = pool.supervisor.workers[0]
    assert worker.process is not None
    old_pid = worker.process.pid
    async with aiohttp.ClientSession() as session:
        await control(session, worker.port or 0, hang=True)
    await wait_for(lambda: worker.state == "unhealthy", what="unhealthy")
    assert not worker.endpoint.available
    await wait_for(lambda: worker.state == "backoff", what="backoff")
    assert old_pid not in live_pids_with(tag)  # SIGTERM was ignored by the hung loop: SIGKILLed
    assert "health probes" in (worker.last_error or "")
    await ready(pool)
    assert worker.process.pid != old_pid


async def test_close_stops_everything_even_sigterm_ignorers(make_pool: MakePool, tag: str) -> None:
    pool = await make_pool(workers=2, stop_timeout=0.5, extra_args=("--standin-grandchild", "--standin-ignore-sigterm"))
    await ready(pool)
    assert len(live_pids_with(tag)) == 6  # 2 x (launcher, stand-in, engine child)
    started = time.monotonic()
    await pool.close()
    assert time.monotonic() - started < 20.0  # timing-only sanity: SIGKILLed, not waited on forever
    assert live_pids_with(tag) == []
    assert states(pool) == ["stopped", "stopped"]
