"""``gateway serve --workers N`` with a ``vllm-pool`` of stand-ins, as a real process tree.

The control process owns the pool: exactly the configured vLLM processes run (under it, not
under a gateway worker); requests through every gateway worker reach them; the calls in flight
of every gateway worker are counted per endpoint in one shared table (``gateway pool status``
shows them); a SIGKILLed gateway worker leaves the vLLM processes running (same pids) and its
replacement serves the pool; SIGTERM to the gateway leaves no vLLM process (the ``tag``
fixture's teardown checks /proc too).

N = 4 as in the issue (about 15 s on this 2-core box; ``GATEWAY_POOL_TEST_WORKERS=2`` for a quicker run).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.backends.vllm.pool.conftest import STANDIN, gateway_yaml, live_pids_with, pool_yaml, wait_no_pids
from tests.conftest import eventually, free_port

ROOT = Path(__file__).resolve().parents[4]
WORKERS = int(os.environ.get("GATEWAY_POOL_TEST_WORKERS", "4"))
POOL = 2  # vLLM stand-ins the pool runs
BOOT = 90.0  # seconds a loaded box may take to start N interpreters and the stand-ins


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _gateway_workers(control: int) -> list[int]:
    text = Path(f"/proc/{control}/task/{control}/children").read_text()
    return [p for p in map(int, text.split()) if _cmdline(p)[1:4] == ["-m", "gateway", "worker"]]


def _standins(tag: str) -> list[int]:
    """The stand-in vLLM servers themselves (not their launchers)."""
    return [p for p in live_pids_with(tag) if any(a.endswith("standin_worker.py") for a in _cmdline(p)[1:3])]


async def _ask(session: aiohttp.ClientSession, url: str) -> tuple[str, str]:
    """(answering gateway worker's request-id prefix, answering stand-in's port) of one fresh connection."""
    body = {"model": "m", "prompt": "hello", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body, headers={"Connection": "close"}) as resp:
        data: dict[str, Any] = await resp.json()
        assert resp.status == 200, data
        port = re.match(r" w(\d+)", data["choices"][0]["text"])
        assert port is not None, data
        return resp.headers["x-request-id"][:16], port[1]


async def _spread(session: aiohttp.ClientSession, url: str, gateways: int) -> tuple[set[str], set[str]]:
    """Requests until ``gateways`` gateway workers and both stand-ins answered."""
    seen_gw: set[str] = set()
    seen_ports: set[str] = set()

    async def check() -> bool:
        try:
            gw, port = await _ask(session, url)
        except aiohttp.ClientError:
            return False
        seen_gw.add(gw)
        seen_ports.add(port)
        return len(seen_gw) >= gateways and len(seen_ports) == POOL

    await eventually(check, within=BOOT)
    return seen_gw, seen_ports


async def _delay(session: aiohttp.ClientSession, status: dict[str, Any], seconds: float) -> None:
    """Every stand-in holds each completion ``seconds`` before answering."""
    for w in status["workers"]:
        async with session.post(f"http://127.0.0.1:{w['port']}/standin/control", json={"delay": seconds}) as resp:
            assert resp.status == 200


def _status(log_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((log_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data


async def test_workers_route_over_one_pool_owned_by_the_control_process(tag: str, tmp_path: Path) -> None:
    port = free_port()
    log_dir = tmp_path / "logs"
    config = tmp_path / "gw.yaml"
    config.write_text(gateway_yaml(pool_yaml(tag, log_dir, workers=POOL), server="drain_timeout: 10"))
    errors = tmp_path / "gateway.err"
    with errors.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port),
            "--workers", str(WORKERS), cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: len(_gateway_workers(proc.pid)) == WORKERS, within=BOOT)
            gateways, _ = await _spread(session, url, WORKERS)
            # Exactly the configured vLLM processes, each under a launcher of the control process.
            standins = sorted(_standins(tag))
            assert len(standins) == POOL, standins
            assert {_ppid(_ppid(p)) for p in standins} == {proc.pid}

            # The calls in flight of every gateway worker, per endpoint, in one table. The kernel
            # decides which gateway worker accepts a connection: calls go out a few at a time
            # until more than one gateway worker has some.
            status = _status(log_dir)
            await _delay(session, status, 60)
            calls: list[asyncio.Task[tuple[str, str]]] = []

            def counted() -> bool:
                return sum(w["in_flight"] for w in _status(log_dir).get("workers", [])) == len(calls)

            for _ in range(8):
                for _ in range(2 * WORKERS):
                    calls.append(asyncio.create_task(_ask(session, url)))
                    await asyncio.sleep(0.1)
                await eventually(counted, within=BOOT)
                workers = _status(log_dir)["workers"]
                rows = [sum(w["in_flight_by"][k] for w in workers) for k in range(WORKERS)]
                if sum(1 for r in rows if r) >= 2:
                    break
            assert sum(1 for r in rows if r) >= 2, rows
            assert all(len(w["in_flight_by"]) == WORKERS for w in workers)
            assert all(w["in_flight"] == sum(w["in_flight_by"]) for w in workers)
            # Least load over the whole gateway's counts: the endpoints carry the same (within one).
            per_endpoint = [w["in_flight"] for w in workers]
            assert max(per_endpoint) - min(per_endpoint) <= 1, workers
            shown = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "pool", "status", "--config", str(config), cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out = (await shown.communicate())[0].decode()
            assert shown.returncode == 0, out
            assert f"control process pid {proc.pid} of {WORKERS} gateway workers" in out, out
            assert "by gateway worker" in out and "g0:" in out and f"g{WORKERS - 1}:" in out, out
            for call in calls:  # the clients hang up: every gateway worker releases its calls
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await eventually(lambda: not any(w["in_flight"] for w in _status(log_dir)["workers"]), within=BOOT)
            await _delay(session, status, 0)

            # A gateway worker dies: the pool does not notice; its replacement serves it.
            victim = _gateway_workers(proc.pid)[0]
            os.kill(victim, signal.SIGKILL)
            await eventually(
                lambda: len(_gateway_workers(proc.pid)) == WORKERS and victim not in _gateway_workers(proc.pid),
                within=BOOT,
            )
            assert sorted(_standins(tag)) == standins  # the same vLLM processes, still running
            after, _ = await _spread(session, url, WORKERS)
            assert after - gateways, "the restarted gateway worker never answered"
            assert sorted(_standins(tag)) == standins
            assert all(w["restarts"] == 0 for w in _status(log_dir)["workers"])

        # SIGTERM: the workers drain, then the control process stops every vLLM process.
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
        assert wait_no_pids(tag) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = errors.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert STANDIN  # the stand-ins above are the pool tests' own (never a real vLLM)
