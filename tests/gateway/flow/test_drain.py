"""SIGTERM drain with the real ``gateway serve`` process and a fake upstream in this process."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import eventually, free_port
from tests.fakes import Behaviour, FakeUpstream

ROOT = Path(__file__).resolve().parents[3]

CONFIG = """
server: {{host: 127.0.0.1, port: {port}, drain_timeout: {drain_timeout}, drain_delay: {drain_delay}}}
backends:
  - {{name: a, type: openai, base_url: '{upstream}', timeout: {{connect: 2, first_byte: 10, stream_idle: 10}}}}
models:
  - {{name: m, routes: [{{backend: a, model: up-a}}]}}
"""


class Served:
    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()


Start = Callable[..., Awaitable[Served]]


@pytest.fixture
async def start(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Start]:
    procs: list[asyncio.subprocess.Process] = []

    async def run(drain_timeout: float, drain_delay: float = 0.0) -> Served:
        port = free_port()
        path = tmp_path / f"gw-{port}.yaml"
        path.write_text(
            CONFIG.format(port=port, drain_timeout=drain_timeout, drain_delay=drain_delay, upstream=fake_upstream.url)
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(path), cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:

            async def healthy() -> bool:
                assert proc.returncode is None, "gateway exited early"
                return await health_status(session, url) == 200

            await eventually(healthy, within=30)
        return Served(proc, url)

    try:
        yield run
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def health_status(session: aiohttp.ClientSession, url: str) -> int | None:
    """``/health``'s status, or None when no connection could be made."""
    try:
        async with session.get(f"{url}/health") as resp:
            return resp.status
    except aiohttp.ClientConnectionError:
        return None


async def refuses_connections(url: str) -> bool:
    async with aiohttp.ClientSession() as fresh:
        return await health_status(fresh, url) is None


def chunks_and_tail(raw: bytes) -> tuple[list[dict[str, object]], list[bytes]]:
    events = [e for e in raw.split(b"\n\n") if e]
    parsed = [orjson.loads(e[6:]) for e in events if e != b"data: [DONE]"]
    return parsed, events


async def test_sigterm_lets_an_in_flight_stream_finish(start: Start, fake_upstream: FakeUpstream) -> None:
    # drain_timeout far beyond everything here: the gateway must exit because the stream
    # finished, not because the deadline came (the real process has no clock to fake).
    served = await start(drain_timeout=60, drain_delay=2.0)
    fake_upstream.script.append(Behaviour(kind="ok", delay=0.05))  # 20 chunks over about a second
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{served.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 20, "stream": True}
        )
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        served.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # During the delay: still accepting, but /health tells the load balancer to go away;
        # after it: no new connections. Each side is awaited, not timed.
        async with aiohttp.ClientSession() as other:

            async def draining() -> bool:
                return await health_status(other, served.url) == 503

            await eventually(draining)
            async with other.get(f"{served.url}/health") as health:
                assert await health.json() == {"status": "draining"}

        await eventually(lambda: refuses_connections(served.url))
        raw = first + await resp.read()
    chunks, events = chunks_and_tail(raw)
    assert events[-1] == b"data: [DONE]"
    assert [c["choices"][0]["text"] for c in chunks] == [f" t{i}" for i in range(20)]  # type: ignore[index]
    assert all("error" not in c for c in chunks)
    rc = await asyncio.wait_for(served.proc.wait(), timeout=30)
    assert rc == 0
    assert time.monotonic() - signalled < 30  # timing-only sanity: well before the 60 s drain_timeout
    assert "Traceback" not in await served.stderr()


async def test_drain_timeout_ends_a_stream_with_an_error_event_not_a_cut(
    start: Start, fake_upstream: FakeUpstream
) -> None:
    served = await start(drain_timeout=0.3)
    fake_upstream.script.append(Behaviour(kind="stall_mid", events=1, delay=3600))  # never ends by itself
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            f"{served.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 200, "stream": True}
        )
        first = await resp.content.readuntil(b"\n\n")
        served.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        raw = first + await resp.read()
    _, events = chunks_and_tail(raw)
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2][6:])["error"]
    assert error["code"] == "gateway_shutting_down"
    rc = await asyncio.wait_for(served.proc.wait(), timeout=30)
    assert rc == 0
    assert time.monotonic() - signalled < 30  # timing-only sanity: the stream alone would never end
    # The upstream stream was abandoned too, not left generating.
    await eventually(lambda: fake_upstream.cancelled_streams == 1 and fake_upstream.open_streams == 0)
    assert "Traceback" not in await served.stderr()


async def test_drain_lets_a_non_streaming_request_finish(start: Start, fake_upstream: FakeUpstream) -> None:
    served = await start(drain_timeout=10)
    held = Behaviour(kind="hold")
    fake_upstream.script.append(held)
    async with aiohttp.ClientSession() as session:
        pending = asyncio.create_task(
            session.post(f"{served.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        )
        await eventually(lambda: fake_upstream.active == 1)
        served.proc.send_signal(signal.SIGTERM)
        await eventually(lambda: refuses_connections(served.url))  # the drain has begun
        held.release()  # the upstream answers while the gateway drains
        resp = await pending
        assert resp.status == 200
        assert (await resp.json())["choices"][0]["text"] == " hello world"
    assert await asyncio.wait_for(served.proc.wait(), timeout=10) == 0


async def test_drain_timeout_answers_a_waiting_request_503_not_a_dropped_connection(
    start: Start, fake_upstream: FakeUpstream
) -> None:
    served = await start(drain_timeout=0.3)
    fake_upstream.script.append(Behaviour(kind="hold"))  # never released: only the drain deadline ends it
    async with aiohttp.ClientSession() as session:
        pending = asyncio.create_task(
            session.post(f"{served.url}/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        )
        await eventually(lambda: fake_upstream.active == 1)
        served.proc.send_signal(signal.SIGTERM)
        resp = await pending
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "1"
        assert (await resp.json())["error"]["code"] == "gateway_shutting_down"
    assert await asyncio.wait_for(served.proc.wait(), timeout=10) == 0
    await eventually(lambda: fake_upstream.active == 0)  # the upstream request was abandoned too
    assert fake_upstream.cancelled == 1
