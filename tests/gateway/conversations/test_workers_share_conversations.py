"""``gateway serve --workers 2`` as a real process tree with a real ``redis-server``: every worker
sees the same stored responses, and they survive a worker killed and restarted and a SIGHUP
reload; with the memory store, the two workers refuse by name what they could not share.

Which worker answered is told by the request id's per-process prefix (``x-request-id``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from gateway.conversations import ConversationStore, input_items, new_id
from gateway.responses_state import FinishedTurn
from gateway.store import ANONYMOUS, RedisStore
from tests.conftest import free_port
from tests.gateway.security.conftest import RedisServer

ROOT = Path(__file__).resolve().parents[3]
CONFIG = """
server: {{host: 127.0.0.1, port: {port}}}
backends: [{{name: sim, type: mock}}]
models: [{{name: m, routes: [{{backend: sim, model: m}}]}}]
responses: {{store: '{store}', store_prefix: {prefix}}}
"""


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@asynccontextmanager
async def serve(tmp_path: Path, store: str, prefix: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, store=store, prefix=prefix))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2", cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as probe:
            await _every_worker(probe, url, "/health", proc)
        yield proc, url
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _every_worker(
    session: aiohttp.ClientSession, url: str, path: str, proc: asyncio.subprocess.Process
) -> dict[str, tuple[int, dict[str, object]]]:
    """``GET path`` over fresh connections until both workers answered: prefix -> (status, body)."""
    seen: dict[str, tuple[int, dict[str, object]]] = {}
    deadline = time.monotonic() + 60
    while len(seen) < 2:
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, f"both workers did not answer {path}: {seen}"
        try:
            async with session.get(url + path, headers={"Connection": "close"}) as resp:
                seen[resp.headers["x-request-id"][:16]] = (resp.status, await resp.json())
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)
    return seen


async def test_every_worker_sees_the_conversations_across_a_restart_and_a_reload(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = f"w{time.monotonic_ns()}"
    writer = ConversationStore(RedisStore(redis_server.url, "responses", ttl=600, prefix=prefix))
    rid = new_id("resp")
    response = {"id": rid, "object": "response", "status": "completed", "model": "m", "output": []}
    await writer.save(ANONYMOUS, FinishedTurn(response, input_items("kept"), None))
    try:
        async with serve(tmp_path, redis_server.url, prefix) as (proc, url), aiohttp.ClientSession() as http:
            answers = await _every_worker(http, url, f"/v1/responses/{rid}", proc)
            assert {status for status, _ in answers.values()} == {200}
            assert all(body["id"] == rid for _, body in answers.values())
            victim = _children(proc.pid)[0]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not (len(_children(proc.pid)) == 2 and victim not in _children(proc.pid)):
                assert time.monotonic() < deadline, "the killed worker did not come back"
                await asyncio.sleep(0.1)
            answers = await _every_worker(http, url, f"/v1/responses/{rid}/input_items", proc)
            assert {status for status, _ in answers.values()} == {200}
            proc.send_signal(signal.SIGHUP)
            await asyncio.sleep(1.0)
            answers = await _every_worker(http, url, f"/v1/responses/{rid}", proc)
            assert {status for status, _ in answers.values()} == {200}
    finally:
        await writer.close()


async def test_memory_store_with_two_workers_refuses_by_name(tmp_path: Path) -> None:
    async with serve(tmp_path, "memory", "gateway") as (proc, url), aiohttp.ClientSession() as http:
        answers = await _every_worker(http, url, f"/v1/responses/{new_id('resp')}", proc)
    for status, body in answers.values():
        assert status == 400
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == "store_not_shared"
        assert "2 worker processes" in error["message"] and "Redis" in error["message"]
