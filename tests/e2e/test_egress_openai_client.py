"""End to end: the openai SDK -> the gateway -> a forward proxy process (proxy.py, Basic auth)
-> an upstream that demands mutual TLS, signed by a private CA made in the test (trustme).

The gateway is built from YAML as ``gateway serve`` builds it, the proxy credentials coming
from ``${PROXY_USER}`` / ``${PROXY_PASS}``. Then the failures as the SDK sees them: a wrong
CA and refused proxy credentials, each a 502 naming the backend and the reason, counted in
``/metrics``; a model with a second route fails over. ``tls.verify: false`` is logged as a
warning at start-up and on reload.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.app import create_app
from gateway.configfile import load_config
from gateway.reload import enable_reload
from tests.backends.transport.egress_parts import PKI, PROXY_PASSWORD, PROXY_USER, ForwardProxy
from tests.conftest import eventually, serve_app
from tests.fakes import FakeUpstream


@pytest.fixture
async def upstreams(pki: PKI) -> AsyncIterator[tuple[FakeUpstream, FakeUpstream]]:
    mtls = FakeUpstream(ssl_context=pki.server_context(require_client=True))
    plain_tls = FakeUpstream(ssl_context=pki.server_context())
    await mtls.start()
    await plain_tls.start()
    yield mtls, plain_tls
    await mtls.stop()
    await plain_tls.stop()


def config_text(pki: PKI, proxy: ForwardProxy, mtls: FakeUpstream, plain_tls: FakeUpstream, lab: str = "") -> str:
    tls = f"{{ca_file: {pki.ca_file}, cert_file: {pki.client_cert_file}, key_file: {pki.client_key_file}}}"
    via = f"http://${{PROXY_USER}}:${{PROXY_PASS}}@127.0.0.1:{proxy.port}"
    return f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: corp-openai, type: openai, base_url: {mtls.url}, api_key: sk-upstream, proxy: "{via}", tls: {tls}}}
  - {{name: corp-vllm, type: vllm, base_url: {mtls.url}, proxy: "{via}", tls: {tls}}}
  - {{name: wrong-ca, type: openai, base_url: {plain_tls.url}, proxy: "{via}", tls: {{ca_file: {pki.other_ca_file}}}}}
  - name: bad-proxy-auth
    type: openai
    base_url: {mtls.url}
    proxy: http://${{PROXY_USER}}:not-the-password@127.0.0.1:{proxy.port}
    tls: {tls}
{lab}models:
  - {{name: gpt, routes: [{{backend: corp-openai, model: upstream-gpt}}]}}
  - {{name: llama, routes: [{{backend: corp-vllm, model: upstream-llama}}]}}
  - {{name: wrong-ca, routes: [{{backend: wrong-ca, model: x}}]}}
  - {{name: bad-proxy-auth, routes: [{{backend: bad-proxy-auth, model: x}}]}}
  - {{name: failover, routes: [{{backend: wrong-ca, model: x}}, {{backend: corp-openai, model: upstream-gpt}}]}}
"""


@pytest.fixture
async def gateway(
    pki: PKI,
    forward_proxy: ForwardProxy,
    upstreams: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[str]:
    monkeypatch.setenv("PROXY_USER", PROXY_USER)
    monkeypatch.setenv("PROXY_PASS", PROXY_PASSWORD)
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text(pki, forward_proxy, *upstreams))
    app = create_app(load_config(path))
    runner, url = await serve_app(app)
    yield url
    await runner.cleanup()


@pytest.fixture
async def client(gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway}/v1", api_key="x", max_retries=0, timeout=20) as c:
        yield c


@pytest.mark.parametrize("model", ["gpt", "llama"])
async def test_sdk_reaches_an_mtls_upstream_through_the_proxy(
    client: openai.AsyncOpenAI, model: str, forward_proxy: ForwardProxy, upstreams: tuple[FakeUpstream, FakeUpstream]
) -> None:
    mtls, _ = upstreams
    completion = await client.completions.create(model=model, prompt="hi", max_tokens=4)
    assert completion.choices[0].text == " hello world"
    chat = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content
    async with client.chat.completions.stream(model=model, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join([event.delta async for event in stream if event.type == "content.delta"])
    assert text
    assert [r.path for r in mtls.requests] == ["/v1/completions", "/v1/chat/completions", "/v1/chat/completions"]
    assert mtls.connections == 1  # one CONNECT tunnel, kept alive across the three calls
    assert all("Proxy-Authorization" not in r.headers for r in mtls.requests)


async def test_a_wrong_ca_is_a_clear_502(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await client.completions.create(model="wrong-ca", prompt="hi", max_tokens=4)
    assert info.value.status_code == 502
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "upstream_tls_error" and error["type"] == "upstream_error"
    assert error["message"] == (
        "backend 'wrong-ca': TLS with the upstream failed: certificate verify failed: "
        "unable to get local issuer certificate"
    )


async def test_refused_proxy_credentials_are_a_clear_502(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model="bad-proxy-auth", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 502
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "upstream_proxy_auth_failed"
    assert "backend 'bad-proxy-auth'" in error["message"] and "407" in error["message"]
    assert "not-the-password" not in str(error) and PROXY_USER not in str(error)


async def test_a_tls_failure_fails_over_and_is_counted(client: openai.AsyncOpenAI, gateway: str) -> None:
    completion = await client.completions.create(model="failover", prompt="hi", max_tokens=4)
    assert completion.choices[0].text == " hello world"
    async with aiohttp.ClientSession() as session, session.get(gateway + "/metrics") as resp:
        metrics = await resp.text()
    assert 'gateway_upstream_errors_total{backend="wrong-ca",reason="tls"} 1.0' in metrics
    assert 'gateway_failovers_total{backend="wrong-ca",model="failover",reason="tls"} 1.0' in metrics


async def test_verify_off_is_logged_at_start_up_and_reload(
    pki: PKI,
    forward_proxy: ForwardProxy,
    upstreams: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("PROXY_USER", PROXY_USER)
    monkeypatch.setenv("PROXY_PASS", PROXY_PASSWORD)
    caplog.set_level(logging.WARNING, logger="gateway.egress")
    lab = f"  - {{name: lab, type: openai, base_url: {upstreams[1].url}, tls: {{verify: false}}}}\n"
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text(pki, forward_proxy, *upstreams, lab=lab))
    app = create_app(load_config(path))
    reloader = enable_reload(app, path)
    runner, _ = await serve_app(app)
    try:

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "gateway.egress"]

        assert [w.split(":")[0] for w in warnings()] == ["start-up"]
        assert "backend lab: tls.verify is false" in warnings()[0]
        path.write_text(
            config_text(pki, forward_proxy, *upstreams, lab=lab)
            + "  - {name: more, routes: [{backend: lab, model: y}]}\n"
        )
        assert await reloader.reload()
        await eventually(lambda: len(warnings()) == 2)
        assert warnings()[1].startswith("config reload: backend lab: tls.verify is false")
    finally:
        await runner.cleanup()
