"""SIGHUP to a real ``gateway serve`` under load (issue 15, "Measured"): keep-alive clients in a
loop see no failed request while the config is swapped; the changed route takes the traffic and
the removed backend's counters stop growing without being reset. An invalid file, or one that
moves the listener, is refused: one ERROR line per problem naming its YAML path, and the running
config keeps serving."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time
from pathlib import Path

import aiohttp

from tests.conftest import eventually, free_port
from tests.gateway.workers.procs import stop_gateway
from tests.keepalive_load import Tally, client

ROOT = Path(__file__).resolve().parents[3]
CLIENTS = 8

CONFIG = """
server: {{host: 127.0.0.1, port: {port}, drain_timeout: 10}}
backends:
  - {{name: {backend}, type: mock, token_delay_ms: 5}}
models:
  - {{name: m, routes: [{{backend: {backend}, model: m}}]}}
"""


async def _served_by(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """``gateway_requests_total`` of model m with status 200, by backend."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    found: dict[str, float] = {}
    for match in re.finditer(r"gateway_requests_total\{([^}]*)\} ([0-9.e+]+)", text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if labels.get("model") == "m" and labels.get("status") == "200":
            found[labels["backend"]] = float(match.group(2))
    return found


class _Log:
    """The gateway's stderr, read as it comes."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self._task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode(errors="replace").rstrip())

    async def wait_for(self, needle: str, within: float = 15.0) -> None:
        deadline = time.monotonic() + within
        while not any(needle in line for line in self.lines):
            assert time.monotonic() < deadline, f"no log line with {needle!r}:\n" + "\n".join(self.lines[-30:])
            await asyncio.sleep(0.02)


async def test_sighup_under_load_swaps_the_route_and_fails_no_request(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, backend="a"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    log = _Log(proc.stderr)
    url = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    tally = Tally()
    clients: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as probe:
            deadline = time.monotonic() + 20
            while True:
                assert proc.returncode is None, "gateway exited early:\n" + "\n".join(log.lines)
                try:
                    async with probe.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "gateway did not become healthy"
                await asyncio.sleep(0.05)

            clients = [asyncio.create_task(client(url, n, tally, stop, max_tokens=8)) for n in range(CLIENTS)]
            await eventually(lambda: tally.ok > CLIENTS or bool(tally.failures), within=60)
            assert tally.ok > CLIENTS, f"the load did not get going: {tally.failures[:3]}"

            # 1. An invalid file: refused, every problem on its own ERROR line with its YAML path.
            path.write_text(CONFIG.format(port=port, backend="a").replace("token_delay_ms: 5", "token_delay_ms: -5"))
            proc.send_signal(signal.SIGHUP)
            await log.wait_for("still serving the previous config")
            refused = [line for line in log.lines if " ERROR " in line]
            assert any("backends[0].token_delay_ms:" in line for line in refused), refused
            assert not any("Traceback" in line for line in log.lines)

            # 2. A new listener: refused, restart needed.
            path.write_text(CONFIG.format(port=free_port(), backend="b"))
            proc.send_signal(signal.SIGHUP)
            await log.wait_for("server.port: changed; it needs a new listener")
            await asyncio.sleep(0.5)
            assert set(await _served_by(probe, url)) == {"a"}  # the old config still serves

            # 3. A changed route (backend a removed, b added): applied under load.
            path.write_text(CONFIG.format(port=port, backend="b"))
            proc.send_signal(signal.SIGHUP)
            await log.wait_for("config reload applied")
            # Once a is closed its last request is counted (events, not sleeps: a slow machine may
            # still be finishing requests of the old config a second later).
            await log.wait_for("config reload: closed backend(s) a")
            first = await _served_by(probe, url)

            async def b_grew() -> bool:
                return (await _served_by(probe, url)).get("b", 0) > first.get("b", 0)

            await eventually(b_grew, within=60)
            second = await _served_by(probe, url)
            stop.set()
            await asyncio.gather(*clients)
    finally:
        stop.set()
        for task in clients:
            task.cancel()
        await stop_gateway(proc)

    assert tally.failures == [], tally.failures[:5]
    assert first["a"] > 0
    assert second["a"] == first["a"], "the removed backend still takes traffic"  # and was not reset
    assert second["b"] > first["b"], "the new route does not take the traffic"
    assert proc.returncode == 0
    print(
        f"requests answered: {tally.ok}, failed: {len(tally.failures)}; "
        f"served by a={second['a']:.0f} b={second['b']:.0f}"
    )
