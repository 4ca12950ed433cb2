"""SIGTERM does not wait on idle keep-alive connections (docs/routing-and-resilience.md, Shutdown).

A client pool that keeps a connection open after its last answer used to hold the process
for the whole ``drain_timeout``: the drain's idle close cancelled aiohttp's wait for the next
request, which ended the connection's task without closing its socket, so the connection
stayed open and the drain waited it out. With ``drain_timeout: 60`` the gateway must now exit
about the idle grace (2 s) after the signal, having closed each idle connection, for one
process and for ``--workers 2``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.gateway.workers.test_faults import ROOT, _children

DRAIN_TIMEOUT = 60
CONFIG = """
server: {{host: 127.0.0.1, port: {port}, drain_timeout: {drain}}}
backends:
  - {{name: sim, type: mock}}
models:
  - {{name: m, routes: [{{backend: sim, model: m}}]}}
"""
IDLE = 4  # keep-alive connections left open after one answer each


async def _answered(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A keep-alive connection with one answer read from it; None while the gateway is not up."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    if b" 200 " not in head.split(b"\r\n")[0]:
        writer.close()
        return None
    return reader, writer


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_with_idle_keep_alive_connections_exits_after_the_grace(tmp_path: Path, workers: int) -> None:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, drain=DRAIN_TIMEOUT))
    args = ["--workers", str(workers)] if workers > 1 else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), *args, cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while workers > 1 and len(_children(proc.pid)) < workers:
            assert time.monotonic() < deadline, "the workers did not start"
            await asyncio.sleep(0.05)
        idle = []
        while len(idle) < IDLE:
            assert proc.returncode is None, "gateway exited early"
            assert time.monotonic() < deadline, "gateway did not answer"
            conn = await _answered(port)
            if conn is None:
                await asyncio.sleep(0.05)
            else:
                idle.append(conn)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # Each idle connection is closed by the gateway (EOF), not held for the drain timeout.
        for reader, _ in idle:
            assert await asyncio.wait_for(reader.read(), timeout=DRAIN_TIMEOUT / 2) == b""
        rc = await asyncio.wait_for(proc.wait(), timeout=DRAIN_TIMEOUT / 2)
        took = time.monotonic() - signalled
        for _, writer in idle:
            writer.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0
    assert took < DRAIN_TIMEOUT / 4, took  # about the 2 s grace; the old code waited the full 60 s
    assert proc.stderr is not None
    assert "Traceback" not in (await proc.stderr.read()).decode()
