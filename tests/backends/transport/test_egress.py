"""Egress in every transport, against real parts: TLS upstreams signed by a private CA made here
(trustme), mutual TLS, and a forward proxy process (proxy.py) with Basic authentication.

Each case runs on the httptools client (the default), aiohttp and httpx: a request through a
CONNECT tunnel to an mTLS upstream, a plain-http upstream through the proxy, TLS in TLS via an
``https://`` proxy, ``server_name``, ``verify: false``, ``trust_env``; and every failure as its
typed 502 naming the backend and the reason: a wrong CA, an expired certificate, a certificate
for another name, no client certificate, proxy credentials refused, the proxy unreachable.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from backends.errors import UpstreamError, UpstreamProxyError, UpstreamTLSError
from backends.openai.adapter import OpenAIBackend
from backends.transport import HTTPTransport, make_transport
from schemas.config import OpenAIBackendConfig
from tests.backends.transport.egress_parts import PKI, PROXY_PASSWORD, ForwardProxy, RefusingTLSServer
from tests.conftest import eventually, free_port
from tests.fakes import FakeUpstream

TRANSPORTS = ["httptools", "aiohttp", "httpx"]
JSON = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}
BODY = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4})


@asynccontextmanager
async def serving(ctx: ssl.SSLContext | None) -> AsyncIterator[FakeUpstream]:
    up = FakeUpstream(ssl_context=ctx)
    await up.start()
    try:
        yield up
    finally:
        await up.stop()


@pytest.fixture
async def mtls_upstream(pki: PKI) -> AsyncIterator[FakeUpstream]:
    """https, signed by the private CA, requiring a client certificate the CA signed."""
    async with serving(pki.server_context(require_client=True)) as up:
        yield up


@pytest.fixture
async def plain_upstream() -> AsyncIterator[FakeUpstream]:
    async with serving(None) as up:
        yield up


def config(kind: str, base_url: str, **egress: Any) -> OpenAIBackendConfig:
    return OpenAIBackendConfig.model_validate(
        {
            "name": "corp",
            "type": "openai",
            "base_url": base_url,
            "transport": kind,
            "timeout": {"connect": 5, "first_byte": 10, "total": 20, "stream_idle": 10},
            **egress,
        }
    )


def mtls(pki: PKI, **more: Any) -> dict[str, Any]:
    return {"ca_file": pki.ca_file, "cert_file": pki.client_cert_file, "key_file": pki.client_key_file, **more}


async def complete(t: HTTPTransport, base_url: str) -> dict[str, Any]:
    resp = await t.send("POST", base_url + "/completions", body=BODY, headers=JSON, stream=False)
    try:
        assert resp.status == 200, resp.status
        data: dict[str, Any] = orjson.loads(await resp.read())
        return data
    finally:
        resp.release()


async def succeeds(kind: str, base_url: str, *, times: int = 1, **egress: Any) -> None:
    t = make_transport(config(kind, base_url, **egress))
    try:
        for _ in range(times):
            assert (await complete(t, base_url))["choices"][0]["text"]
    finally:
        await t.close()


async def failure(kind: str, base_url: str, **egress: Any) -> UpstreamError:
    t = make_transport(config(kind, base_url, **egress))
    try:
        with pytest.raises(UpstreamError) as info:
            await complete(t, base_url)
    finally:
        await t.close()
    err = info.value
    assert err.status == 502 and err.backend == "corp" and "backend 'corp'" in err.message, err.message
    return err


# --- it works ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_mtls_upstream_through_an_authenticating_proxy(
    kind: str, pki: PKI, forward_proxy: ForwardProxy, mtls_upstream: FakeUpstream
) -> None:
    await succeeds(kind, mtls_upstream.url, times=3, proxy=forward_proxy.url(), tls=mtls(pki))
    assert mtls_upstream.connections == 1  # one tunnel, kept alive
    await eventually(lambda: forward_proxy.saw(f"CONNECT 127.0.0.1:{mtls_upstream.port}"))


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_plain_http_upstream_through_the_proxy(
    kind: str, forward_proxy: ForwardProxy, plain_upstream: FakeUpstream
) -> None:
    await succeeds(kind, plain_upstream.url, proxy=forward_proxy.url())
    seen = plain_upstream.requests[-1].headers
    assert "Proxy-Authorization" not in seen  # the proxy consumed it; the upstream never sees it
    assert seen["Authorization"] == "Bearer sk-test"
    # the request went to the proxy in absolute form, with the proxy's credentials (logged at close)
    await eventually(lambda: forward_proxy.saw(f"POST 127.0.0.1:{plain_upstream.port}/v1/completions - 200"))


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_tls_in_tls_through_an_https_proxy(
    kind: str, pki: PKI, https_forward_proxy: ForwardProxy, mtls_upstream: FakeUpstream
) -> None:
    await succeeds(kind, mtls_upstream.url, proxy=https_forward_proxy.url(), tls=mtls(pki))
    await eventually(lambda: https_forward_proxy.saw(f"CONNECT 127.0.0.1:{mtls_upstream.port}"))


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_server_name_is_the_name_checked(kind: str, pki: PKI) -> None:
    async with serving(pki.server_context(pki.elsewhere)) as up:  # a certificate for elsewhere.internal only
        await succeeds(kind, up.url, tls={"ca_file": pki.ca_file, "server_name": "elsewhere.internal"})
        err = await failure(kind, up.url, tls={"ca_file": pki.ca_file})
    assert isinstance(err, UpstreamTLSError)
    assert "certificate verify failed: IP address mismatch" in err.message


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_verify_off_accepts_any_certificate(kind: str, pki: PKI) -> None:
    async with serving(pki.server_context(pki.expired)) as up:  # expired, and no CA given to trust
        await succeeds(kind, up.url, tls={"verify": False})


async def test_health_probe_goes_through_the_proxy_with_mtls(
    pki: PKI, forward_proxy: ForwardProxy, mtls_upstream: FakeUpstream
) -> None:
    for password, healthy in ((PROXY_PASSWORD, True), ("wrong", False)):
        egress = {"proxy": forward_proxy.url(password=password), "tls": mtls(pki)}
        backend = OpenAIBackend(config("httptools", mtls_upstream.url, **egress))
        try:
            assert await backend.health() is healthy
        finally:
            await backend.close()


# --- the environment, with trust_env only ----------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_trust_env_takes_https_proxy_no_proxy_and_ssl_cert_file(
    kind: str, pki: PKI, forward_proxy: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", pki.ca_file)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url())
    for name in ("https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with serving(pki.server_context()) as up:
        # off (the default): neither the CA of SSL_CERT_FILE nor the proxy counts
        err = await failure(kind, up.url)
        assert isinstance(err, UpstreamTLSError) and "unable to get local issuer certificate" in err.message
        # on: both
        await succeeds(kind, up.url, trust_env=True)
        await eventually(lambda: forward_proxy.saw(f"CONNECT 127.0.0.1:{up.port}"))
        # NO_PROXY names the host: direct (a proxy that refuses everything proves it is not used)
        monkeypatch.setenv("HTTPS_PROXY", forward_proxy.url(password="wrong"))
        monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.0/8")
        await succeeds(kind, up.url, trust_env=True)


# --- failures: typed, clear, naming the backend and the reason ------------------------------------


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("via_proxy", [False, True])
async def test_wrong_ca(kind: str, via_proxy: bool, pki: PKI, forward_proxy: ForwardProxy) -> None:
    egress: dict[str, Any] = {"tls": mtls(pki, ca_file=pki.other_ca_file)}
    if via_proxy:
        egress["proxy"] = forward_proxy.url()
    async with serving(pki.server_context()) as up:
        err = await failure(kind, up.url, **egress)
    assert isinstance(err, UpstreamTLSError) and err.reason == "tls" and err.code == "upstream_tls_error"
    assert "certificate verify failed: unable to get local issuer certificate" in err.message
    assert err.retryable and not err.retry_here  # failed over, never retried on this backend


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_expired_certificate(kind: str, pki: PKI) -> None:
    async with serving(pki.server_context(pki.expired)) as up:
        err = await failure(kind, up.url, tls={"ca_file": pki.ca_file})
    assert isinstance(err, UpstreamTLSError)
    assert "certificate verify failed: certificate has expired" in err.message


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_certificate_for_another_name(kind: str, pki: PKI) -> None:
    async with serving(pki.server_context(pki.elsewhere)) as up:
        err = await failure(kind, up.url.replace("127.0.0.1", "localhost"), tls={"ca_file": pki.ca_file})
    assert isinstance(err, UpstreamTLSError)
    assert "certificate verify failed: Hostname mismatch, certificate is not valid for 'localhost'" in err.message


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_upstream_refuses_a_missing_client_certificate(kind: str, pki: PKI) -> None:
    server = RefusingTLSServer(pki.server_context(require_client=True))
    try:
        err = await failure(kind, server.url, tls={"ca_file": pki.ca_file})
        # The server thread counts the refusal after its alert left: the client may read it first.
        await eventually(server.refused.is_set)
    finally:
        server.stop()
    assert server.handshakes_refused == 1
    assert isinstance(err, UpstreamTLSError), err
    # TLS 1.3: the server's alert comes after our side of the handshake, as the answer to the request
    assert "alert certificate required (sent by the upstream" in err.message


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("https", [True, False])
async def test_proxy_refuses_the_credentials(
    kind: str,
    https: bool,
    pki: PKI,
    forward_proxy: ForwardProxy,
    mtls_upstream: FakeUpstream,
    plain_upstream: FakeUpstream,
) -> None:
    up = mtls_upstream if https else plain_upstream  # CONNECT, or an absolute-form request
    err = await failure(kind, up.url, proxy=forward_proxy.url(password="not-" + PROXY_PASSWORD), tls=mtls(pki))
    assert isinstance(err, UpstreamProxyError) and err.reason == "proxy_auth"
    assert err.code == "upstream_proxy_auth_failed" and "407" in err.message
    assert PROXY_PASSWORD not in err.message
    assert err.retryable and not err.retry_here
    assert not up.requests


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_proxy_unreachable(kind: str, pki: PKI, mtls_upstream: FakeUpstream) -> None:
    port = free_port()  # nothing listens there
    err = await failure(kind, mtls_upstream.url, proxy=f"http://u:{PROXY_PASSWORD}@127.0.0.1:{port}", tls=mtls(pki))
    assert isinstance(err, UpstreamProxyError) and err.reason == "proxy", err
    assert "cannot reach its proxy" in err.message and str(port) not in err.message
    assert err.retryable and err.retry_here


async def test_a_plain_https_failure_without_egress_keys_is_typed_too(pki: PKI) -> None:
    """No tls/proxy keys at all (the plain path): an untrusted certificate is still a TLS error, not 'unreachable'."""
    async with serving(pki.server_context()) as up:
        err = await failure("httptools", up.url)
    assert isinstance(err, UpstreamTLSError)
    assert "unable to get local issuer certificate" in err.message


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_under_uvloop(kind: str, pki: PKI, forward_proxy: ForwardProxy, https_forward_proxy: ForwardProxy) -> None:
    """``gateway serve`` runs uvloop: CONNECT + start_tls, TLS in TLS and the TLS alert there too."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        refusing = RefusingTLSServer(pki.server_context(require_client=True))
        try:
            async with serving(pki.server_context(require_client=True)) as up:
                for via in (forward_proxy, https_forward_proxy):
                    await succeeds(kind, up.url, times=2, proxy=via.url(), tls=mtls(pki))
                bad_ca = mtls(pki, ca_file=pki.other_ca_file)
                err = await failure(kind, up.url, proxy=forward_proxy.url(), tls=bad_ca)
                assert isinstance(err, UpstreamTLSError) and "certificate verify failed" in err.message
                err = await failure(kind, up.url, proxy=forward_proxy.url(password="wrong"), tls=mtls(pki))
                assert isinstance(err, UpstreamProxyError) and err.reason == "proxy_auth"
            no_cert = {"proxy": forward_proxy.url(), "tls": {"ca_file": pki.ca_file}}
            if kind != "aiohttp":
                err = await failure(kind, refusing.url, **no_cert)
                assert isinstance(err, UpstreamTLSError) and "alert certificate required" in err.message
            else:  # aiohttp on uvloop: writing the body may meet the closed transport before the alert is read
                t = make_transport(config(kind, refusing.url, **no_cert))
                with pytest.raises(UpstreamError) as info:
                    await complete(t, refusing.url)
                await t.close()
                assert info.value.status == 502 and info.value.reason in ("tls", "connect")
        finally:
            refusing.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
