"""API keys: off by default, 401 without a valid key, 403 (and hidden) for a model the key may not use.

Each test names the rule it pins; removing the rule from ``gateway.security.auth``/``gateway.security.guard``
makes it fail.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.configfile import ConfigError, load_config, parse_config
from gateway.security import auth as auth_module
from gateway.security.auth import presented_key
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL
from tests.gateway.security.conftest import (
    AUTH_A,
    AUTH_B,
    KEY_A,
    KEY_B,
    METRICS_KEY,
    MakeSecureGateway,
    auth_section,
)

ROOT = Path(__file__).resolve().parents[3]
BODY = {"model": MOCK_MODEL, "prompt": "hello", "max_tokens": 4}


async def call(
    url: str, path: str = "/v1/completions", *, headers: dict[str, str] | None = None, body: Any = BODY
) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session:
        if path == "/v1/completions":
            ctx = session.post(url + path, json=body, headers=headers or {})
        else:
            ctx = session.get(url + path, headers=headers or {})
        async with ctx as resp:
            raw = await resp.read()
            ctype = resp.headers.get("Content-Type", "")
            return resp.status, dict(resp.headers), orjson.loads(raw) if "json" in ctype else raw.decode()


# --- off by default ---------------------------------------------------------------------------
def test_quickstart_has_no_auth() -> None:
    """The quickstart config stays keyless: auth is off unless an ``auth:`` section exists."""
    config = load_config(ROOT / "deploy" / "examples" / "quickstart.yaml")
    assert config.auth is None


async def test_auth_off_serves_without_a_key_and_adds_no_headers(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway()
    status, headers, body = await call(gw.url)
    assert status == 200, body
    assert not any(h.lower().startswith("x-ratelimit") for h in headers)
    status, _, models = await call(gw.url, "/v1/models")
    assert status == 200
    assert {m["id"] for m in models["data"]} == {OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL}


async def test_auth_off_installs_no_wrapper_or_hook(secure_gateway: MakeSecureGateway) -> None:
    """The hot path with auth off: the plain handlers are registered, no response hook is added."""
    from gateway.http import handlers

    gw = await secure_gateway()
    routes = {(r.method, r.resource.canonical): r.handler for r in gw.app.router.routes() if r.resource is not None}
    assert routes[("POST", "/v1/completions")] is handlers.completions
    assert routes[("GET", "/v1/models")] is handlers.list_models
    assert routes[("GET", "/metrics")] is handlers.metrics
    assert len(gw.app.on_response_prepare) == 0


# --- 401 ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-not-a-configured-key-at-all"},
        {"Authorization": f"Bearer {KEY_A}x"},  # one character off
        {"Authorization": f"Basic {KEY_A}"},  # wrong scheme
        {"Authorization": "Bearer "},
        {"api-key": KEY_A[:-1]},
        {"api-key": ""},
    ],
    ids=["none", "unknown", "longer", "basic", "empty-bearer", "shorter", "empty-api-key"],
)
async def test_missing_or_wrong_key_is_401(secure_gateway: MakeSecureGateway, headers: dict[str, str]) -> None:
    gw = await secure_gateway(auth_section())
    for path in ("/v1/completions", "/v1/models"):
        status, _, body = await call(gw.url, path, headers=headers)
        assert status == 401, (path, body)
        assert body["error"]["type"] == "authentication_error"
        assert body["error"]["code"] == "invalid_api_key"
        assert KEY_A not in orjson.dumps(body).decode()
    assert gw.upstream.requests == []


async def test_bearer_and_api_key_headers_both_work(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    for headers in (AUTH_A, {"api-key": KEY_A}, {"authorization": f"bearer {KEY_A}"}, AUTH_B):
        status, _, body = await call(gw.url, headers=headers)
        assert status == 200, (headers, body)


async def test_key_given_as_sha256_in_the_config(secure_gateway: MakeSecureGateway) -> None:
    """team-b is configured by digest only; its plaintext still authenticates."""
    gw = await secure_gateway(auth_section())
    assert f"key_sha256: {hashlib.sha256(KEY_B.encode()).hexdigest()}" in auth_section()
    status, _, _ = await call(gw.url, headers={"Authorization": f"Bearer {KEY_B}"})
    assert status == 200


async def test_comparison_is_constant_time(secure_gateway: MakeSecureGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest found by lookup is confirmed with hmac.compare_digest, never ``==``."""
    calls: list[tuple[bytes, bytes]] = []
    real = auth_module.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    gw = await secure_gateway(auth_section(extra=f"  metrics_key: {METRICS_KEY}\n"))
    assert (await call(gw.url, headers=AUTH_A))[0] == 200
    assert calls and calls[-1][0] == hashlib.sha256(KEY_A.encode()).digest()
    calls.clear()
    assert (await call(gw.url, "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}))[0] == 200
    assert calls


def test_presented_key_parsing() -> None:
    assert presented_key({"Authorization": "Bearer  abc "}) == "abc"
    assert presented_key({"Authorization": "Token abc"}) is None
    assert presented_key({"Authorization": "Bearer x", "api-key": "y"}) == "x"
    assert presented_key({"api-key": " y "}) == "y"
    assert presented_key({}) is None


# --- 403 and the per-key model list -------------------------------------------------------------
async def test_model_not_allowed_is_403_and_hidden(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    status, _, body = await call(gw.url, headers=AUTH_B, body={**BODY, "model": OPENAI_MODEL})
    assert status == 403
    assert body["error"]["type"] == "permission_error"
    assert body["error"]["param"] == "model"
    assert "team-b" in body["error"]["message"]
    assert gw.upstream.requests == []
    _, _, models = await call(gw.url, "/v1/models", headers=AUTH_B)
    assert [m["id"] for m in models["data"]] == [MOCK_MODEL]
    _, _, models = await call(gw.url, "/v1/models", headers=AUTH_A)
    assert {m["id"] for m in models["data"]} == {OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL}


async def test_unknown_model_stays_404_for_a_valid_key(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    status, _, body = await call(gw.url, headers=AUTH_B, body={**BODY, "model": "no-such-model"})
    assert status == 404
    assert body["error"]["code"] == "model_not_found"


def test_model_globs_must_match_a_configured_model() -> None:
    text = (
        "backends: [{name: sim, type: mock}]\n"
        "models: [{name: m1, routes: [{backend: sim, model: x}]}]\n"
        f"auth: {{keys: [{{name: a, key: {KEY_A}, models: [m1, 'gpt-*']}}]}}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert info.value.problems == [("auth.keys[0].models[1]", "'gpt-*' matches no configured model")]


@pytest.mark.parametrize(
    ("entry", "where", "message"),
    [
        ("{name: a, key: short}", "auth.keys[0].key", "must be at least 16 characters"),
        ("{name: a}", "auth.keys[0]", "give exactly one of key, key_sha256"),
        ("{name: a, key_sha256: abc}", "auth.keys[0].key_sha256", "String should match pattern"),
    ],
)
def test_key_config_errors(entry: str, where: str, message: str) -> None:
    text = (
        "backends: [{name: sim, type: mock}]\n"
        "models: [{name: m1, routes: [{backend: sim, model: x}]}]\n"
        f"auth: {{keys: [{entry}]}}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    [(path, text_)] = info.value.problems
    assert path == where
    assert message in text_


def test_same_secret_twice_is_a_config_error() -> None:
    sha = hashlib.sha256(KEY_A.encode()).hexdigest()
    text = (
        "backends: [{name: sim, type: mock}]\n"
        "models: [{name: m1, routes: [{backend: sim, model: x}]}]\n"
        f"auth: {{keys: [{{name: a, key: {KEY_A}}}, {{name: b, key_sha256: {sha}}}]}}\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert info.value.problems == [("auth.keys[1]", "the same secret as auth.keys[0]")]


def test_key_from_environment() -> None:
    text = (
        "backends: [{name: sim, type: mock}]\n"
        "models: [{name: m1, routes: [{backend: sim, model: x}]}]\n"
        "auth: {keys: [{name: a, key: '${TEAM_A_KEY}'}]}\n"
    )
    config = parse_config(text, env={"TEAM_A_KEY": KEY_A})
    assert config.auth is not None
    assert config.auth.keys[0].sha256 == hashlib.sha256(KEY_A.encode()).hexdigest()
    assert KEY_A not in repr(config) and KEY_A not in config.model_dump_json()


# --- /metrics behind its own key ------------------------------------------------------------------
async def test_metrics_key(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section(extra=f"  metrics_key: {METRICS_KEY}\n"))
    assert (await call(gw.url, "/metrics"))[0] == 401
    assert (await call(gw.url, "/metrics", headers=AUTH_A))[0] == 401  # an API key is not the metrics key
    status, _, text = await call(gw.url, "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"})
    assert status == 200 and "gateway_requests_total" in text
    assert (await call(gw.url, "/health"))[0] == 200  # liveness stays open for probes


async def test_metrics_open_without_a_metrics_key(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    assert (await call(gw.url, "/metrics"))[0] == 200


# --- per-key metrics -----------------------------------------------------------------------------
async def test_per_key_metrics_use_configured_names_only(secure_gateway: MakeSecureGateway) -> None:
    gw = await secure_gateway(auth_section())
    await call(gw.url, headers=AUTH_A)
    await call(gw.url, headers=AUTH_B, body={**BODY, "model": OPENAI_MODEL})  # 403
    await call(gw.url, headers={"Authorization": "Bearer sk-invented-by-a-client-1234"})  # 401
    _, _, text = await call(gw.url, "/metrics")
    assert 'gateway_key_requests_total{key="team-a",status="200"} 1.0' in text
    assert 'gateway_key_requests_total{key="team-b",status="403"} 1.0' in text
    assert 'gateway_key_rejections_total{key="team-b",reason="model"} 1.0' in text
    assert 'gateway_key_rejections_total{key="_none",reason="unauthenticated"} 1.0' in text
    assert 'gateway_requests_total{backend="_none",endpoint="completions",model="_unknown",status="401"} 1.0' in text
    assert 'gateway_key_tokens_total{key="team-a",kind="completion"}' in text
    assert "sk-invented" not in text
