"""``gateway serve --workers 2`` as a real process tree with a real ``redis-server``: every worker
sees the same stored responses, and they survive a worker killed and restarted and a SIGHUP
reload; with the memory store, the two workers refuse by name what they could not share.

Which worker answered is told by the request id's per-process prefix (``x-request-id``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.cli import main
from gateway.conversations import ConversationStore, new_id
from gateway.store import ANONYMOUS, RedisStore
from tests.conftest import free_port
from tests.gateway.security.conftest import RedisServer
from tests.gateway.workers.procs import kill_a_worker

ROOT = Path(__file__).resolve().parents[3]
CONFIG = """
server: {{host: 127.0.0.1, port: {port}}}
backends: [{{name: sim, type: mock}}]
models: [{{name: m, routes: [{{backend: sim, model: m}}]}}]
responses: {{store: '{store}', store_prefix: {prefix}}}
"""


@asynccontextmanager
async def serve(tmp_path: Path, store: str, prefix: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, store=store, prefix=prefix))
    with (tmp_path / "gateway.err").open("wb") as err:  # read by _reloaded
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2", cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=err,
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


def _reloads(tmp_path: Path) -> int:
    """How many times the workers logged a reload applied (a few KB of log: read whole)."""
    return (tmp_path / "gateway.err").read_bytes().count(b"config reload applied")


async def _reloaded(proc: asyncio.subprocess.Process, tmp_path: Path, before: int) -> None:
    """Until both workers logged the SIGHUP's reload applied (not a fixed sleep: on a loaded
    machine the turns after it would otherwise all run before the reload they are meant to cross)."""
    deadline = time.monotonic() + 60
    while _reloads(tmp_path) < before + 2:
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, "the workers did not apply the reload"
        await asyncio.sleep(0.05)


async def _continue_on_every_worker(
    session: aiohttp.ClientSession, url: str, previous: str, proc: asyncio.subprocess.Process
) -> str:
    """Continue ``previous`` over fresh connections until both workers did it; the last turn's id."""
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2:
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, "both workers did not continue the conversation"
        body = {"model": "m", "input": "and then?", "previous_response_id": previous, "max_output_tokens": 4,
                "truncation": "auto"}  # the workers may take turns unevenly: a long conversation  # fmt: skip
        try:
            async with session.post(url + "/v1/responses", json=body, headers={"Connection": "close"}) as resp:
                answer = await resp.json()
                assert resp.status == 200, answer
                seen.add(resp.headers["x-request-id"][:16])
                previous = answer["id"]
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.1)
    return previous


async def test_every_worker_continues_the_conversations_across_a_restart_and_a_reload(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    prefix = f"w{time.monotonic_ns()}"
    reader = ConversationStore(RedisStore(redis_server.url, "responses", ttl=600, prefix=prefix))
    try:
        async with serve(tmp_path, redis_server.url, prefix) as (proc, url), aiohttp.ClientSession() as http:
            body = {"model": "m", "input": "remember 42", "max_output_tokens": 4}
            async with http.post(url + "/v1/responses", json=body) as resp:
                first = (await resp.json())["id"]
            last = await _continue_on_every_worker(http, url, first, proc)
            await kill_a_worker(proc)
            last = await _continue_on_every_worker(http, url, last, proc)
            before = _reloads(tmp_path)
            proc.send_signal(signal.SIGHUP)
            await _reloaded(proc, tmp_path, before)
            last = await _continue_on_every_worker(http, url, last, proc)
            answers = await _every_worker(http, url, f"/v1/responses/{first}/input_items", proc)
            assert {status for status, _ in answers.values()} == {200}
        history = await reader.history(ANONYMOUS, last)  # one conversation, every turn in order
        texts = [item["content"][0]["text"] for item in history if item.get("role") == "user"]
        assert texts[0] == "remember 42" and len(texts) >= 7 and set(texts[1:]) == {"and then?"}
    finally:
        await reader.close()


async def test_memory_store_with_two_workers_refuses_by_name(tmp_path: Path) -> None:
    async with serve(tmp_path, "memory", "gateway") as (proc, url), aiohttp.ClientSession() as http:
        answers = await _every_worker(http, url, f"/v1/responses/{new_id('resp')}", proc)
    for status, body in answers.values():
        assert status == 400
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == "store_not_shared"
        assert "2 worker processes" in error["message"] and "Redis" in error["message"]


def test_check_config_says_what_memory_does_with_several_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=0, store="memory", prefix="gateway"))
    assert main(["check-config", str(path), "--workers", "2"]) == 0  # served, not refused
    assert "responses.store: memory with 2 workers keeps no conversations" in capsys.readouterr().out
    path.write_text(CONFIG.format(port=0, store="redis://127.0.0.1:6379/0", prefix="gateway"))
    assert main(["check-config", str(path), "--workers", "2"]) == 0
    assert "responses.store" not in capsys.readouterr().out
