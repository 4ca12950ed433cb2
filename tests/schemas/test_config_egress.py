"""The egress keys of an HTTP backend (``proxy``, ``tls``, ``trust_env``) at load, and their routing rules.

Mistakes are reported at their YAML path with the file named, never echoing a proxy URL (it may
hold credentials); credentials from ``${VAR}`` stay secret in ``repr`` and error bodies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.errors import redact
from backends.transport.egress import Egress, Proxy, egress_of, no_proxy
from gateway.configfile import ConfigError, parse_config
from gateway.http.hardening import register_secrets
from schemas.config import OpenAIBackendConfig
from tests.backends.transport.egress_parts import PKI

PASSWORD = "p@ss:w0rd/with#odd"  # percent-encoded in the URL, as any proxy URL must be
QUOTED = "p%40ss%3Aw0rd%2Fwith%23odd"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


def text(egress: str) -> str:
    lines = "".join(f"    {line}\n" for line in egress.strip().splitlines())
    return (
        "backends:\n  - name: corp\n    type: openai\n    base_url: https://llm.internal/v1\n"
        + lines
        + "models:\n  - name: m\n    routes: [{backend: corp, model: m}]\n"
    )


def problems(egress: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(text(egress), "test.yaml", env or {})
    return info.value.problems


def backend(egress: str, env: dict[str, str] | None = None) -> OpenAIBackendConfig:
    config = parse_config(text(egress), "test.yaml", env or {})
    b = config.backends[0]
    assert isinstance(b, OpenAIBackendConfig)
    return b


def test_proxy_credentials_from_the_environment_stay_secret() -> None:
    b = backend(
        "proxy: http://${PROXY_USER}:${PROXY_PASS}@proxy.corp:3128", {"PROXY_USER": "svc-gw", "PROXY_PASS": QUOTED}
    )
    assert QUOTED not in repr(b) and "proxy.corp" not in repr(b)
    egress = egress_of(b)
    proxy = egress.proxy_for("https", "llm.internal", 443)
    assert proxy is not None and proxy.url == "http://proxy.corp:3128"
    assert proxy.username == "svc-gw" and proxy.password == PASSWORD  # percent-decoding
    assert PASSWORD not in repr(proxy) and QUOTED not in repr(proxy)
    # an upstream that echoes the password in an error body: redacted, encoded or not
    register_secrets(parse_config(text(f"proxy: http://svc-gw:{QUOTED}@proxy.corp:3128"), "t", {}))
    assert redact(f"bad password {PASSWORD} / {QUOTED}".encode()) == b"bad password [redacted] / [redacted]"


@pytest.mark.parametrize(
    "url",
    [
        "socks5://u:SECRETPASS@proxy:1080",
        "http://u:SECRETPASS@proxy:3128/path",
        "http://u:SECRETPASS@:3128",
        "http://u:SECRETPASS@proxy:99999",
        "proxy.corp:3128",
    ],
)
def test_bad_proxy_url_is_refused_without_echoing_it(url: str) -> None:
    [(path, message)] = problems(f"proxy: {url}")
    assert path == "backends[0].proxy"
    assert "SECRETPASS" not in message and "proxy:" not in message.split(" ", 1)[1]


def test_tls_files_are_checked_at_load(pki: PKI, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    assert problems(f"tls: {{ca_file: {missing}}}") == [
        ("backends[0].tls.ca_file", f"cannot read {str(missing)!r}: No such file or directory")
    ]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    [(path, message)] = problems(f"tls: {{ca_file: {garbage}}}")
    assert path == "backends[0].tls" and "holds no usable PEM certificate" in message
    [(path, message)] = problems(f"tls: {{cert_file: {pki.client_cert_file}, key_file: {pki.ca_file}}}")
    assert path == "backends[0].tls" and "is not a usable certificate and key" in message
    [(path, message)] = problems(f"tls: {{key_file: {pki.client_key_file}}}")
    assert "key_file needs cert_file" in message
    [(path, message)] = problems(f"tls: {{ca_file: {pki.ca_file}, verify: false}}")
    assert "ca_file has no use with verify: false" in message
    [(path, _)] = problems("tls: {server_name: 'not a name'}")
    assert path == "backends[0].tls.server_name"
    ok = backend(f"tls: {{ca_file: {pki.ca_file}, cert_file: {pki.client_cert_file}, key_file: {pki.client_key_file}}}")
    assert ok.tls is not None and ok.tls.verify


def test_trust_env_checks_the_proxy_variables_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "ftp://u:SECRETPASS@x")
    backend("trust_env: false")  # not read without trust_env
    backend("trust_env: true\nproxy: http://proxy.corp:3128")  # an explicit proxy wins
    [(path, message)] = problems("trust_env: true")
    assert path == "backends[0]" and "https_proxy must be an http:// or https:// URL" in message
    assert "SECRETPASS" not in message
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")  # no scheme: http, as curl reads it
    monkeypatch.setenv("NO_PROXY", ".svc.cluster.local,10.0.0.0/8")
    egress = egress_of(backend("trust_env: true"))
    assert egress.proxy_for("https", "llm.internal", 443) == Proxy.parse("http://proxy.corp:3128")
    assert egress.proxy_for("https", "vllm.ml.svc.cluster.local", 443) is None
    assert egress.proxy_for("https", "10.1.2.3", 8000) is None
    assert egress.proxy_for("http", "llm.internal", 80) is None  # HTTP_PROXY unset: direct


def test_no_egress_keys_is_the_plain_path() -> None:
    assert egress_of(backend("")).direct
    assert egress_of(backend("trust_env: false")).direct
    assert not egress_of(backend("proxy: http://proxy.corp:3128")).direct
    assert not Egress("b", server_name="x.internal").direct


@pytest.mark.parametrize(
    ("entries", "host", "port", "bypass"),
    [
        ("*", "anything", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),
        (".example.com", "api.example.com", 443, True),
        ("*.example.com", "api.example.com", 443, True),
        ("example.com", "notexample.com", 443, False),
        ("example.com:8443", "example.com", 443, False),
        ("example.com:8443", "example.com", 8443, True),
        ("10.0.0.0/8, 192.168.1.5", "10.20.30.40", 80, True),
        ("10.0.0.0/8, 192.168.1.5", "192.168.1.5", 80, True),
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("::1", "::1", 80, True),
        ("[::1]:8000", "::1", 8000, True),
        ("EXAMPLE.com", "Example.COM.", 443, True),
        ("", "example.com", 443, False),
    ],
)
def test_no_proxy_reads_as_curl_does(entries: str, host: str, port: int, bypass: bool) -> None:
    assert no_proxy(entries, host, port) is bypass
