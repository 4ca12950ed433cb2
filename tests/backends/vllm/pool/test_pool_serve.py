"""``gateway serve`` with a ``vllm-pool`` backend, as a real process: status, metrics, no orphans.

The gateway runs as a subprocess so it can be SIGTERMed (drain, then workers stopped)
and SIGKILLed (the launchers see their parent die and stop the workers). Either way no
process of the pool may be left: the ``tag`` fixture scans /proc at teardown, and each
test checks it explicitly too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from backends.vllm.routing.status import read_status
from gateway.cli import main as gateway_main
from tests.backends.vllm.pool.conftest import gateway_yaml, live_pids_with, pool_yaml, wait_no_pids
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[4]


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, config: Path, status: Path) -> None:
        self.proc, self.url, self.config, self.status = proc, url, config, status


@pytest.fixture
def serve(tag: str, tmp_path: Path) -> Iterator[Served]:
    """``gateway serve`` with a pool of 2 stand-ins (each with an "engine" child), until both are ready."""
    log_dir = tmp_path / "pool"
    port = free_port()
    text = gateway_yaml(
        pool_yaml(
            tag,
            log_dir,
            workers=2,
            stop_timeout=1,
            extra_args=("--standin-grandchild",),
            routing="{strategy: prefix-affinity, metrics_interval: 0.05, wait_for_ready: 10}",
        ),
        server="drain_timeout: 5",
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(text)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "gateway.log", "wb"),
    )
    status = log_dir / "status.json"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "gateway.log").read_text())
            if status.exists() and [w.state for w in read_status(status).workers] == ["ready", "ready"]:
                break
            assert time.monotonic() < deadline, "pool not ready in time"
            time.sleep(0.05)
        yield Served(proc, f"http://127.0.0.1:{port}", config, status)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


async def test_sigkill_of_the_gateway_leaves_no_process(serve: Served, tag: str) -> None:
    assert len(live_pids_with(tag)) == 6  # 2 x (launcher, stand-in, engine child)
    os.kill(serve.proc.pid, signal.SIGKILL)
    serve.proc.wait()
    # The launchers get SIGTERM from the kernel (parent death) and clean up their groups.
    assert wait_no_pids(tag, within=5.0) == []


async def test_sigterm_drains_then_stops_the_workers(serve: Served, tag: str) -> None:
    status = read_status(serve.status)
    async with aiohttp.ClientSession() as session:
        for w in status.workers:
            async with session.post(f"http://127.0.0.1:{w.port}/standin/control", json={"delay": 0.7}) as resp:
                assert resp.status == 200
        body = {"model": "m", "prompt": "hello", "max_tokens": 3, "stream": True}
        async with session.post(f"{serve.url}/v1/completions", json=body) as resp:
            os.kill(serve.proc.pid, signal.SIGTERM)  # while the request is in flight
            text = await resp.text()
            assert resp.status == 200
    assert text.endswith("data: [DONE]\n\n") and '"error"' not in text  # drained, not cut
    assert await asyncio.to_thread(serve.proc.wait, 15) == 0
    assert live_pids_with(tag) == []  # the workers were stopped before the gateway exited
    assert [w.state for w in read_status(serve.status).workers] == ["stopped", "stopped"]


async def test_pool_status_cli_and_metrics(serve: Served, capsys: pytest.CaptureFixture[str]) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "prompt": "x" * 600, "max_tokens": 2}
        for _ in range(3):
            async with session.post(f"{serve.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
        async with session.get(f"{serve.url}/metrics") as resp:
            metrics = await resp.text()
    assert 'gateway_pool_worker_state{backend="pool",state="ready",worker="0"} 1.0' in metrics
    assert 'gateway_pool_worker_state{backend="pool",state="failed",worker="1"} 0.0' in metrics
    assert 'gateway_pool_worker_restarts_total{backend="pool",worker="1"} 0.0' in metrics
    assert 'gateway_pool_routing_decisions_total{backend="pool",decision="affinity_hit"} 2.0' in metrics
    assert 'gateway_pool_worker_kv_cache_usage{backend="pool",worker="0"}' in metrics

    # The status file is rewritten at least every second.
    deadline = time.monotonic() + 5
    while read_status(serve.status).decisions.get("affinity_hit") != 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert gateway_main(["pool", "status", "--config", str(serve.config)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"pool pool (standin-model): gateway pid {serve.proc.pid}")
    assert lines[1].split() == [
        "worker",
        "state",
        "gpus",
        "port",
        "pid",
        "uptime",
        "restarts",
        "in-flight",
        "queue",
        "kv-cache",
    ]
    assert lines[2].split()[:2] == ["0", "ready"] and lines[3].split()[:2] == ["1", "ready"]
    assert "routing: affinity_hit 2, affinity_miss 1" in out

    assert gateway_main(["pool", "status", "--config", str(serve.config), "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)
    assert [w["state"] for w in status["workers"]] == ["ready", "ready"]
    assert all(w["pid"] and w["port"] and w["log_path"] for w in status["workers"])

    os.kill(serve.proc.pid, signal.SIGKILL)
    serve.proc.wait()
    assert gateway_main(["pool", "status", "--config", str(serve.config)]) == 1
    assert "the gateway is NOT running" in capsys.readouterr().out
