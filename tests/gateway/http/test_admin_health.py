"""``GET /admin/health``: each backend's circuit, last probe, detected version, models served; behind the
admin key when auth is on."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import MakeGateway, eventually
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import AUTH_A, auth_section

ADMIN_KEY = "sk-admin-operator-001122334455"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
BACKENDS = """  - name: probed
    type: openai
    base_url: {url}
    api_key: sk-test-secret
    health_check: {{interval: 0.05, timeout: 1}}
    circuit_breaker: {{consecutive_failures: 1, cooldown: 600}}
"""
MODELS = """  - name: probed-model
    routes: [{backend: probed, model: upstream-gpt}]
"""


async def get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/admin/health", headers=headers) as resp:
            return resp.status, await resp.json()


async def test_deep_health(make_gateway: MakeGateway, fake_upstream: FakeUpstream) -> None:
    auth = auth_section(extra=f"  admin_key: {ADMIN_KEY}\n")  # top-level YAML: it may follow the models
    gw = await make_gateway(extra_backends=BACKENDS.format(url=fake_upstream.url), extra_models=MODELS + auth)
    assert (await get(gw.url, {}))[0] == 401
    assert (await get(gw.url, AUTH_A))[0] == 401  # a client's key is not the admin key

    async def probed() -> bool:
        status, body = await get(gw.url, ADMIN)
        return status == 200 and _named(body, "probed")["last_probe"] is not None

    await eventually(probed)
    status, body = await get(gw.url, ADMIN)
    assert status == 200 and body["status"] == "ok"
    names = [b["name"] for b in body["backends"]]
    assert names == ["up-openai", "up-vllm", "sim", "probed"]
    probe = _named(body, "probed")
    assert probe["type"] == "openai"
    assert probe["circuit"] == {"state": "closed", "retry_in": 0.0}
    assert probe["last_probe"]["healthy"] is True and probe["last_probe"]["age"] < 60
    assert probe["models"] == [
        {"model": "probed-model", "upstream_model": "upstream-gpt", "endpoints": ["chat", "completions", "responses"]}
    ]
    vllm = _named(body, "up-vllm")
    assert (vllm["type"], vllm["version"], vllm["version_source"]) == ("vllm", None, "unknown")  # no /version
    assert _named(body, "sim")["last_probe"] is None  # no health_check: never probed

    # the probed backend fails: its circuit opens and the gateway says it is degraded
    gw.upstream.healthy = False
    gw.upstream.script.append(Behaviour(kind="status", status=503, body={"error": {"message": "down"}}))

    async def opened() -> bool:
        _, body = await get(gw.url, ADMIN)
        return _named(body, "probed")["circuit"]["state"] == "open"

    await eventually(opened)
    status, body = await get(gw.url, ADMIN)
    probe = _named(body, "probed")
    assert body["status"] == "degraded" and probe["last_probe"]["healthy"] is False
    assert probe["circuit"]["retry_in"] > 500
    gw.upstream.healthy = True


def _named(body: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [b for b in body["backends"] if b["name"] == name]
    return found
