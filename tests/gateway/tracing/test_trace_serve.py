"""``gateway serve`` (one process and ``--workers 2``) with tracing on: spans from every worker reach the
collector, the access and audit lines name each request's trace, ``/metrics`` counts the exported spans."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import eventually, free_port
from tests.gateway.tracing.receiver import HttpReceiver

ROOT = Path(__file__).resolve().parents[3]
CONFIG = """
server: {{host: 127.0.0.1, port: {port}, access_log: true, audit_log: true, drain_timeout: 1}}
telemetry: {{otlp_endpoint: '{otlp}', sample_ratio: 1.0}}
backends:
  - {{name: sim, type: mock}}
models:
  - {{name: m, routes: [{{backend: sim, model: m}}]}}
"""
REQUESTS = 12


@pytest.mark.parametrize("workers", [1, 2])
async def test_serve_exports_and_logs_the_trace(tmp_path: Path, receiver: HttpReceiver, workers: int) -> None:
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG.format(port=port, otlp=receiver.url))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", str(workers), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def up() -> bool:
                assert proc.returncode is None, "gateway exited"
                try:
                    async with session.get(url + "/health") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await eventually(up, within=60)
            for i in range(REQUESTS):
                payload = {"model": "m", "prompt": f"p{i}", "max_tokens": 2}
                async with session.post(f"{url}/v1/completions", json=payload, headers={"Connection": "close"}) as r:
                    assert r.status == 200
            await eventually(lambda: len(receiver.by_kind("server")) == REQUESTS, within=30)

            async def all_counted() -> bool:  # with N workers: every worker's count, summed (snapshots lag a bit)
                async with session.get(url + "/metrics") as resp:
                    found = re.search(r"^gateway_trace_spans_exported_total (\S+)$", await resp.text(), re.M)
                return found is not None and float(found.group(1)) == 2 * REQUESTS

            await eventually(all_counted, within=30)
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, err = await proc.communicate()
    text = err.decode()
    servers = {s.trace_id: s.span_id for s in receiver.by_kind("server")}
    assert len(servers) == REQUESTS and len(receiver.by_kind("client")) == REQUESTS
    access = re.findall(r'"POST /v1/completions HTTP/1.1" 200 .* trace_id=([0-9a-f]{32}) span_id=([0-9a-f]{16})', text)
    assert dict(access) == servers
    audit = [orjson.loads(line[line.index("{") :]) for line in text.splitlines() if '"event":"completion"' in line]
    assert {a["trace_id"]: a["span_id"] for a in audit} == servers
