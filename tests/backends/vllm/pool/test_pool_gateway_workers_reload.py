"""SIGHUP to the control process of ``gateway serve --workers 2`` with a ``vllm-pool`` of stand-ins (issue 15).

One gateway, three reloads, under keep-alive load the whole time (streams and not):

1. an invalid file: refused in the control process with its YAML path, forwarded to no gateway
   worker, the same vLLM processes serve;
2. a routing-only change: applied in place, the same vLLM processes;
3. a changed ``vllm_args``: the control process replaces the vLLM processes one at a time (at
   most one extra alive at once), every old one is gone, the new ones answer through every
   gateway worker, and no request failed.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.backends.vllm.pool.conftest import gateway_yaml, pool_yaml, port_range, wait_no_pids
from tests.backends.vllm.pool.test_pool_gateway_workers import _cmdline, _gateway_workers, _standins
from tests.conftest import eventually, free_port
from tests.keepalive_load import Tally, load

ROOT = Path(__file__).resolve().parents[4]
WORKERS = 2
BOOT = 90.0  # seconds a loaded box may take to start the interpreters and the stand-ins
CLIENTS = 6


async def _more(tally: Tally, n: int) -> None:
    before = tally.ok
    await eventually(lambda: tally.ok >= before + n, within=BOOT)


def _status(log_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((log_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return data


async def _answered_by(url: str) -> tuple[str, str]:
    """(gateway worker's request-id prefix, stand-in port) of a request on a fresh connection."""
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "prompt": "hello", "max_tokens": 2}
        async with session.post(url + "/v1/completions", json=body, headers={"Connection": "close"}) as resp:
            data: dict[str, Any] = await resp.json()
            assert resp.status == 200, data
            port = re.match(r" w(\d+)", data["choices"][0]["text"])
            assert port is not None, data
            return resp.headers["x-request-id"][:16], port[1]


def _lines(path: Path, pattern: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if re.search(pattern, line)]


async def test_sighup_to_the_control_process_rolls_a_changed_pool_under_load(tag: str, tmp_path: Path) -> None:
    ports = port_range()
    log_dir = tmp_path / "logs"
    config = tmp_path / "gw.yaml"

    def write(routing: str = "round-robin", extra: tuple[str, ...] = (), broken: bool = False) -> None:
        # Streams last a while (6 tokens x 50 ms): a vLLM process is retired with calls in flight.
        args = ("--standin-token-delay", "0.05", *extra)
        routes = f"{{strategy: {routing}, metrics_interval: 0.05, wait_for_ready: 10}}"
        text = pool_yaml(tag, log_dir, ports=ports, extra_args=args, workers=2, routing=routes)
        if broken:
            text += "    no_such_key: 1\n"
        config.write_text(gateway_yaml(text, server="drain_timeout: 10"))

    write()
    errors = tmp_path / "gateway.err"
    port = free_port()
    with errors.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port),
            "--workers", str(WORKERS), cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    reloads: Callable[[], list[str]] = lambda: _lines(errors, r"worker=\d: config reload applied")  # noqa: E731
    try:
        await eventually(lambda: len(_gateway_workers(proc.pid)) == WORKERS, within=BOOT)
        await eventually(
            lambda: [w.get("state") for w in _status(log_dir).get("workers", [])] == ["ready", "ready"], within=BOOT
        )
        old = sorted(_standins(tag))
        assert len(old) == 2
        async with load(url, CLIENTS, max_tokens=6) as tally:
            await _more(tally, 20)

            # 1. Invalid: the control process refuses it, with the YAML path; no worker hears of it.
            write(broken=True)
            proc.send_signal(signal.SIGHUP)
            await eventually(lambda: bool(_lines(errors, r"nothing forwarded")), within=BOOT)
            assert _lines(errors, r"config reload refused: .*gw\.yaml:\d+:\d+: backends\[0\]\.no_such_key")
            assert not _lines(errors, r"worker=\d: config reload")
            await _more(tally, 20)
            assert sorted(_standins(tag)) == old

            # 2. Routing only: every gateway worker applies it; the vLLM processes stay.
            write(routing="least-load")
            proc.send_signal(signal.SIGHUP)
            await eventually(lambda: len(reloads()) == WORKERS, within=BOOT)
            await eventually(lambda: (_status(log_dir).get("rollout") or {}).get("outcome") == "in_place", within=BOOT)
            await _more(tally, 20)
            assert sorted(_standins(tag)) == old

            # 3. New vllm_args: rolled one process at a time by the control process.
            seen: list[int] = []

            async def watch() -> None:
                while True:
                    seen.append(len(_standins(tag)))
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch())
            write(routing="least-load", extra=("--rollout", "2"))
            proc.send_signal(signal.SIGHUP)
            await eventually(lambda: len(reloads()) == 2 * WORKERS, within=BOOT)
            await eventually(lambda: (_status(log_dir).get("rollout") or {}).get("outcome") == "rolled", within=BOOT)
            await _more(tally, 40)
            watcher.cancel()
        assert tally.failures == [], tally.failures[:5]
        assert max(seen) <= 3, max(seen)  # at most one extra vLLM process at a time
        rollout = _status(log_dir)["rollout"]
        assert (rollout["started"], rollout["retired"]) == (2, 2), rollout
        new = sorted(_standins(tag))
        assert len(new) == 2 and not set(new) & set(old)  # every old process gone
        assert all("--rollout" in _cmdline(p) for p in new)
        new_ports = {str(w["port"]) for w in _status(log_dir)["workers"]}
        gateways: set[str] = set()
        answered: set[str] = set()

        async def both() -> bool:
            gw, standin = await _answered_by(url)
            assert standin in new_ports, (standin, new_ports)
            gateways.add(gw)
            answered.add(standin)
            return len(gateways) == WORKERS and answered == new_ports

        await eventually(both, within=BOOT)  # the new processes serve through every gateway worker

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
        assert wait_no_pids(tag) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = errors.read_text()
    assert "Traceback" not in text, text[-3000:]
