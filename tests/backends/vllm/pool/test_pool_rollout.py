"""``VLLMPoolBackend.reconfigure`` over stand-in workers (issue 15): in-place changes restart
nothing; a rollout replaces the workers one at a time; a new worker that never gets ready
stops the rollout and the old workers keep serving; GPU slots are freed before reuse."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.pool.rollout import IN_PLACE_KEYS, RESTART_KEYS, ROLLED_KEYS
from backends.vllm.routing.status import read_status
from schemas.config import VLLMPoolBackendConfig
from tests.backends.vllm.pool.conftest import MakePool, pool_config, worker_info
from tests.conftest import eventually


def _pids(pool: VLLMPoolBackend) -> list[int | None]:
    return [w.status().pid for w in pool.supervisor.workers]


async def _all_ready(pool: VLLMPoolBackend, count: int) -> None:
    await eventually(
        lambda: len(pool.supervisor.workers) == count and all(w.state == "ready" for w in pool.supervisor.workers)
    )


def test_every_pool_key_is_classified() -> None:
    keys = set(VLLMPoolBackendConfig.model_fields) - {"name", "type"}
    assert keys == set(ROLLED_KEYS) | set(IN_PLACE_KEYS) | set(RESTART_KEYS)


async def test_an_in_place_change_restarts_no_process(make_pool: MakePool, tag: str, tmp_path: Path) -> None:
    pool = await make_pool(workers=2, routing="{strategy: round-robin, metrics_interval: 0.05, wait_for_ready: 10}")
    await _all_ready(pool, 2)
    pids = _pids(pool)
    new = pool_config(
        tag,
        tmp_path / "logs0",
        ports=pool.config.port_range,
        workers=2,
        stop_timeout=3,
        routing="{strategy: prefix-hash, metrics_interval: 0.05, wait_for_ready: 10}",
    )
    report = await pool.reconfigure(new)
    assert (report.outcome, sorted(report.in_place), report.rolled) == ("in_place", ["routing", "stop_timeout"], [])
    assert _pids(pool) == pids
    assert pool.dispatcher.balancer.routing.strategy == "prefix-hash"
    assert "hash_preferred" in pool.dispatcher.balancer.decisions
    assert pool.supervisor.config.stop_timeout == 3 and pool.config is new
    assert read_status(pool.status_path).rollouts["in_place"] == 1


async def test_a_rollout_replaces_workers_one_at_a_time(make_pool: MakePool, tag: str, tmp_path: Path) -> None:
    pool = await make_pool(workers=2)
    await _all_ready(pool, 2)
    old = {w.index: w.status().pid for w in pool.supervisor.workers}
    seen: list[int] = []  # live worker processes at each look

    async def watch() -> None:
        while True:
            seen.append(sum(1 for pid in _pids(pool) if pid is not None))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        report = await pool.reconfigure(
            pool_config(tag, tmp_path / "v2", ports=pool.config.port_range, workers=2, extra_args=("--rollout", "2"))
        )
    finally:
        watcher.cancel()
    assert report.ok and (report.outcome, report.started, report.retired) == ("rolled", 2, 2), report
    assert (report.rolled, report.in_place) == (["vllm_args"], ["log_dir"])
    assert all(w.log_path.parent == tmp_path / "v2" for w in pool.supervisor.workers)
    status = read_status(tmp_path / "v2" / "status.json")
    assert status.rollout is not None and status.rollout["outcome"] == "rolled" and status.rollouts["rolled"] == 1
    assert max(seen) <= 3  # never more than one extra worker
    workers = pool.supervisor.workers
    assert [w.index for w in workers] == [
        2,
        0,
    ]  # a free index each; never above the most alive at once and all(w.state == "ready" for w in workers)
    assert not set(old.values()) & set(_pids(pool))
    async with aiohttp.ClientSession() as session:
        for w in workers:
            assert w.port is not None
            assert "--rollout" in (await worker_info(session, w.port))["argv"]
    assert [ep.index for ep in pool.dispatcher.endpoints] == [2, 0]


async def test_a_worker_that_never_gets_ready_stops_the_rollout(make_pool: MakePool, tag: str, tmp_path: Path) -> None:
    pool = await make_pool(workers=2)
    await _all_ready(pool, 2)
    pids = _pids(pool)
    bad = pool_config(
        tag,
        tmp_path / "logs0",
        ports=pool.config.port_range,
        workers=2,
        startup_timeout=5,  # long enough to see it answer with the wrong model: 1 s raced slow starts under load
        extra_args=("--standin-list-model", "x"),
    )
    report = await pool.reconfigure(bad)
    assert report.outcome == "failed" and not report.ok
    assert report.error is not None and "worker 2" in report.error and "does not list" in report.error
    assert _pids(pool) == pids and all(w.state == "ready" for w in pool.supervisor.workers)
    assert pool.config is not bad  # the next reconfigure with it tries again
    status = read_status(pool.status_path)
    assert status.rollouts["failed"] == 1 and status.rollout is not None and status.rollout["outcome"] == "failed"


async def test_gpu_slots_are_freed_before_a_new_worker_takes_them(
    make_pool: MakePool, tag: str, tmp_path: Path
) -> None:
    pool = await make_pool(gpus="[0, 1]", workers=None)
    await _all_ready(pool, 2)
    report = await pool.reconfigure(
        pool_config(
            tag, tmp_path / "logs0", ports=pool.config.port_range, gpus="[0, 1]", workers=None, tensor_parallel_size=2
        )
    )
    assert report.ok and (report.started, report.retired) == (1, 2), report
    await _all_ready(pool, 1)
    async with aiohttp.ClientSession() as session:
        port = pool.supervisor.workers[0].port
        assert port is not None
        assert (await worker_info(session, port))["cuda_visible_devices"] == "0,1"


async def test_a_transport_key_is_refused_by_name(make_pool: MakePool, tag: str, tmp_path: Path) -> None:
    pool = await make_pool()
    report = await pool.reconfigure(
        pool_config(tag, tmp_path / "logs0", ports=pool.config.port_range, max_connections=7)
    )
    assert report.outcome == "refused" and report.error is not None and "max_connections" in report.error
    assert pool.config.max_connections != 7


async def test_a_rollout_cut_short_by_shutdown_leaves_no_process(make_pool: MakePool, tag: str, tmp_path: Path) -> None:
    pool = await make_pool(workers=2)
    await _all_ready(pool, 2)
    slow = pool_config(
        tag, tmp_path / "logs0", ports=pool.config.port_range, workers=2, extra_args=("--standin-startup-delay", "30")
    )
    rollout = asyncio.create_task(pool.reconfigure(slow))
    await eventually(lambda: len(pool.supervisor.workers) == 3)  # the new worker is starting
    rollout.cancel()  # as the gateway's shutdown cancels a reload in progress
    await asyncio.gather(rollout, return_exceptions=True)
    await pool.close()  # the tag fixture then checks that no process of the test is alive
    assert all(w.state == "stopped" for w in pool.supervisor.workers)


async def test_a_rollout_stopped_half_way_is_taken_back_by_the_old_config(
    make_pool: MakePool, tag: str, tmp_path: Path
) -> None:
    pool = await make_pool(workers=2, stop_timeout=30)
    await _all_ready(pool, 2)
    old_config = pool.config
    first, second = pool.supervisor.workers
    state = tmp_path / "starts"
    state.write_text("5")  # the first new worker starts; the test sets it to 0 for the second
    args = ("--standin-fail-starts", "1", "--standin-state", str(state))
    new = pool_config(tag, tmp_path / "logs0", ports=old_config.port_range, workers=2, stop_timeout=30, extra_args=args)
    first.endpoint.in_flight += 1  # a call in flight holds the first old worker in its drain
    rollout = asyncio.create_task(pool.reconfigure(new))
    await eventually(lambda: first.state == "stopping" and pool.supervisor.workers[-1].state == "ready")
    state.write_text("0")
    first.endpoint.in_flight -= 1
    report = await rollout
    assert (report.outcome, report.started, report.retired) == ("failed", 1, 1), report
    mixed = pool.supervisor.workers
    assert [w.config for w in mixed] == [old_config, new] and all(w.state == "ready" for w in mixed)
    assert not pool.runs(old_config) and not pool.runs(new)

    back = await pool.reconfigure(old_config)
    assert (back.outcome, back.started, back.retired) == ("rolled", 1, 1), back
    assert pool.supervisor.workers[0] is second  # already on the old config: kept
    assert [w.config for w in pool.supervisor.workers] == [old_config, old_config] and pool.runs(old_config)
