"""Budgets shared through Redis: ``gateway serve --workers 2`` (a real process tree) with a real redis-server,
where each worker refuses a key whose spend the other worker made; ``gateway keys usage`` reads the same
figures from Redis, and from a running gateway's ``GET /admin/keys`` with the in-memory store."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import main
from schemas.config import worker_problems
from tests.conftest import free_port
from tests.gateway.security.conftest import KEY_A, KEY_B, MakeSecureGateway, RedisServer, auth_section

ROOT = Path(__file__).resolve().parents[3]
ADMIN_KEY = "sk-admin-operator-778899aabb"

# The mock counts one prompt token per word and generates max_tokens: 3 + 5 tokens at 1 and 2 per million
# is 0.000013 a request; a budget of 0.0001 is spent by the eighth (0.000104).
PER_REQUEST = (3 * 1 + 5 * 2) / Decimal(10**6)
BODY = {"model": "m", "prompt": "a b c", "max_tokens": 5}
CONFIG = """
server: {{host: 127.0.0.1, port: {port}}}
backends:
  - {{name: sim, type: mock}}
models:
  - {{name: m, pricing: {{input: 1, output: 2}}, routes: [{{backend: sim, model: m}}]}}
auth:
  store: {store}
  admin_key: {admin}
  keys:
    - {{name: team-a, key: {a}, budget: {{amount: "0.0001", period: total}}}}
    - {{name: team-b, key: {b}}}
"""


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _post(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}  # a new connection: either worker
    async with session.post(url + "/v1/completions", json=BODY, headers=headers) as resp:
        return resp.status, resp.headers["x-request-id"][:16], await resp.read()


async def test_a_budget_spent_on_one_worker_stops_the_key_on_every_worker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG.format(port=port, store=redis_server.url, admin=ADMIN_KEY, a=KEY_A, b=KEY_B))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2", cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            while True:
                assert proc.returncode is None and time.monotonic() < deadline, "gateway did not start"
                try:
                    async with session.get(url + "/health", headers={"Connection": "close"}) as resp:
                        if resp.status == 200 and len(_children(proc.pid)) == 2:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)

            served: dict[str, int] = {}
            for _ in range(8):  # 0.000104 in all: the eighth goes over the budget of 0.0001
                status, worker, raw = await _post(session, url, KEY_A)
                assert status == 200, raw
                served[worker] = served.get(worker, 0) + 1

            async def spent_everywhere() -> bool:  # every worker's charges reached Redis (about 0.5 s)
                code = await asyncio.to_thread(_keys_usage, path)
                return code[0] == 0 and code[1][0]["spent"]["total"] == str(8 * PER_REQUEST)

            deadline = time.monotonic() + 30
            while not await spent_everywhere():
                assert time.monotonic() < deadline, "the spend never reached Redis"
                await asyncio.sleep(0.1)

            refused: dict[str, int] = {}
            for _ in range(200):  # until both workers have refused: each read the other's spend
                status, worker, raw = await _post(session, url, KEY_A)
                assert status == 429, raw
                assert json.loads(raw)["error"]["code"] == "budget_exceeded"
                refused[worker] = refused.get(worker, 0) + 1
                if len(refused) == 2:
                    break
            assert len(refused) == 2, f"one worker took every connection: {refused}"
            # one worker alone spent less than the budget, yet refused: the spend is shared
            assert min(served.get(w, 0) for w in refused) * PER_REQUEST < Decimal("0.0001")
            assert (await _post(session, url, KEY_B))[0] == 200  # another key: no budget, served

            expected = {"team-a": float(8 * PER_REQUEST), "team-b": float(PER_REQUEST)}
            deadline = time.monotonic() + 30
            while (costs := await _costs(session, url)) != expected:  # each worker's snapshot: about once a second
                assert time.monotonic() < deadline, costs
                await asyncio.sleep(0.1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    code, rows = await asyncio.to_thread(_keys_usage, path)
    assert code == 0
    team_a = rows[0]
    assert team_a["key"] == "team-a" and team_a["budget"]["exceeded"] is True
    assert team_a["budget"]["remaining"] == "0"


async def _costs(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """``gateway_cost_total`` per key, from the merged ``/metrics`` of every worker."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        s.labels["key"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gateway_cost_total"
    }


def _keys_usage(path: Path, *extra: str) -> tuple[int, list[dict[str, object]]]:
    """``gateway keys usage --json`` in this process, its printed rows parsed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["keys", "usage", "--config", str(path), "--json", *extra])
    return code, json.loads(out.getvalue()) if code == 0 else []


async def test_keys_usage_reads_a_running_gateway_in_memory_mode(
    secure_gateway: MakeSecureGateway, tmp_path: Path
) -> None:
    auth = auth_section(a='budget: {amount: "0.5", period: month}', extra=f"  admin_key: {ADMIN_KEY}\n")
    gw = await secure_gateway(auth, extra_models="  - {name: pm, pricing: {input: 1, output: 2}, routes: "
                              "[{backend: sim, model: m}]}\n")  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for _ in range(3):
            body = {**BODY, "model": "pm"}
            headers = {"Authorization": f"Bearer {KEY_A}"}
            async with session.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
                assert resp.status == 200
        async with session.get(gw.url + "/admin/keys") as resp:
            assert resp.status == 401  # the admin key is required
        async with session.get(gw.url + "/admin/keys", headers={"Authorization": f"Bearer {KEY_A}"}) as resp:
            assert resp.status == 401  # a client key is not the admin key
    path = tmp_path / "same.yaml"  # the config the gateway serves (only auth matters to the command)
    path.write_text(
        "backends: [{name: sim, type: mock}]\nmodels: [{name: mock-pm, routes: [{backend: sim, model: m}]}]\n" + auth
    )
    code, rows = await asyncio.to_thread(_keys_usage, path, "--url", gw.url)
    assert code == 0
    assert rows[0]["spent"] == {"day": str(3 * PER_REQUEST), "month": str(3 * PER_REQUEST), "total": "0.000039"}
    assert rows[0]["budget"]["remaining"] == str(Decimal("0.5") - 3 * PER_REQUEST)
    assert rows[1] == {"key": "team-b", "spent": {"day": "0", "month": "0", "total": "0"}, "budget": None}


def test_budgets_in_memory_cannot_be_shared_by_workers(tmp_path: Path) -> None:
    from gateway.configfile import parse_config

    text = CONFIG.format(port=8080, store="memory", admin=ADMIN_KEY, a=KEY_A, b=KEY_B)
    problems = worker_problems(parse_config(text, "<test>", env={}), 2)
    assert problems == [
        "auth.keys[0] (team-a): budget with 2 workers need auth.store set to a Redis URL "
        "(the in-memory store would allow each worker the whole limit)"
    ]


@pytest.mark.parametrize("auth_on", [True, False])
async def test_admin_key_guards_the_admin_endpoints(secure_gateway: MakeSecureGateway, auth_on: bool) -> None:
    gw = await secure_gateway(auth_section() if auth_on else "")
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/admin/health") as resp:
            body = await resp.json()
            if auth_on:  # auth on and no admin key configured: off, saying how to turn it on
                assert resp.status == 403 and "auth.admin_key" in body["error"]["message"]
            else:
                assert resp.status == 200 and body["status"] == "ok"
