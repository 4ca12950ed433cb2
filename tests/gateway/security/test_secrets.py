"""No configured secret appears anywhere it should not.

One gateway carries every kind of secret the config knows (an upstream API key, a secret
upstream header, API keys given in clear and as a hash, the metrics key, a Redis password)
and goes through a full run: good and bad keys, every refusal, streams, upstream errors
whose messages echo our credentials back, a Redis outage, the metrics and the audit log,
with every logger at DEBUG and the access log on. Then every log record, every response
(status line, headers, body), the metrics text, the config's ``repr`` and dump, and
config errors are searched for each secret.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import ConfigError, parse_config
from tests.conftest import free_port
from tests.fakes import Behaviour, FakeUpstream
from tests.gateway.security.conftest import KEY_A, KEY_B, KEY_B_SHA256

UPSTREAM_KEY = "sk-upstream-7d1c0ffee5ec12e7"
ORG_SECRET = "org-hidden-2b8e4f1a9c"
METRICS_KEY = "sk-metrics-9a8b7c6d5e4f3a2b"
REDIS_PASSWORD = "redis-pw-4c3b2a1f0e9d"
SECRETS = {
    "upstream api_key": UPSTREAM_KEY,
    "upstream header": ORG_SECRET,
    "team-a key": KEY_A,
    "team-b key (configured as sha256)": KEY_B,
    "metrics key": METRICS_KEY,
    "redis password": REDIS_PASSWORD,
}
ENV = {
    "UPSTREAM_KEY": UPSTREAM_KEY,
    "ORG_SECRET": ORG_SECRET,
    "TEAM_A_KEY": KEY_A,
    "METRICS_KEY": METRICS_KEY,
    "REDIS_PASSWORD": REDIS_PASSWORD,
}


def config_text(upstream_url: str, redis_port: int) -> str:
    return f"""server: {{host: 127.0.0.1, port: 0, audit_log: true, access_log: true}}
backends:
  - name: up-openai
    type: openai
    base_url: {upstream_url}
    api_key: ${{UPSTREAM_KEY}}
    headers: {{OpenAI-Organization: '${{ORG_SECRET}}'}}
    timeout: {{connect: 2, first_byte: 5, total: 10, stream_idle: 5}}
  - name: sim
    type: mock
models:
  - name: gpt-test
    routes: [{{backend: up-openai, model: upstream-gpt}}]
  - name: mock-test
    routes: [{{backend: sim, model: mock-model}}]
caps: {{n: 4}}
auth:
  store: 'redis://:${{REDIS_PASSWORD}}@127.0.0.1:{redis_port}/0'
  redis_timeout: 0.2
  keys:
    - {{name: team-a, key: '${{TEAM_A_KEY}}', rpm: 1000, tpm: 100000}}
    - {{name: team-b, key_sha256: {KEY_B_SHA256}, models: [mock-test], rpm: 2}}
  metrics_key: '${{METRICS_KEY}}'
"""


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # the formatted text, tracebacks included


@pytest.fixture
def all_logs() -> Iterator[Collect]:
    handler = Collect()
    root = logging.getLogger()
    audit = logging.getLogger("gateway.audit")
    old_level = root.level
    root.addHandler(handler)
    audit.addHandler(handler)  # the audit logger does not propagate when it writes JSON to stderr
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        audit.removeHandler(handler)
        root.setLevel(old_level)


def echo(text: str) -> dict[str, Any]:
    """An upstream error body that echoes our credentials back (as some APIs do)."""
    return {"error": {"message": text, "type": "invalid_request_error", "param": None, "code": None}}


async def test_no_secret_leaks_anywhere(fake_upstream: FakeUpstream, all_logs: Collect) -> None:
    seen: list[str] = []  # everything a client or a scraper received
    config = parse_config(config_text(fake_upstream.url, free_port()), "<secrets test>", env=ENV)
    seen += [repr(config), str(config), config.model_dump_json(), repr(config.model_dump())]
    app = create_app(config)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=logging.getLogger("gateway.access"))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    leaked_back = f"Incorrect API key provided: {UPSTREAM_KEY} (organization {ORG_SECRET})"
    a = {"Authorization": f"Bearer {KEY_A}"}
    b = {"api-key": KEY_B}
    requests: list[tuple[str, str, dict[str, str], Any]] = [
        ("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi"}),
        ("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi", "stream": True}),
        ("POST", "/v1/completions", b, {"model": "mock-test", "prompt": "hi", "stream": True}),
        ("POST", "/v1/completions", b, {"model": "mock-test", "prompt": "hi"}),
        ("POST", "/v1/completions", b, {"model": "mock-test", "prompt": "hi"}),  # 429
        ("POST", "/v1/completions", b, {"model": "gpt-test", "prompt": "hi"}),  # 403
        ("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi", "n": 9}),  # cap
        ("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi", "bogus": 1}),  # 400
        ("POST", "/v1/completions", a, b"{not json"),
        ("POST", "/v1/completions", {"Authorization": f"Bearer {KEY_A}x"}, {"model": "gpt-test", "prompt": "hi"}),
        ("POST", "/v1/completions", {"Authorization": f"Bearer {METRICS_KEY}"}, {"model": "gpt-test", "prompt": "x"}),
        ("POST", "/v1/completions", {"api-key": KEY_B[:-1]}, {"model": "mock-test", "prompt": "hi"}),
        ("POST", "/v1/completions", {"Authorization": f"Basic {KEY_A}"}, {"model": "mock-test", "prompt": "hi"}),
        ("GET", "/v1/models", a, None),
        ("GET", "/v1/models", {"api-key": f"{KEY_B} "}, None),
        ("GET", "/metrics", a, None),  # an API key is not the metrics key
        ("GET", "/openapi.json", {}, None),
        ("GET", "/nope", a, None),
    ]
    # The upstream echoes our credentials in error messages of every kind the gateway relays.
    for status in (400, 401, 403, 404, 422, 429, 500, 503):
        fake_upstream.script.append(Behaviour(kind="status", status=status, body=echo(leaked_back)))
        requests.append(("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi"}))
    fake_upstream.script.append(Behaviour(kind="status", status=400, body=leaked_back.encode()))  # not JSON
    requests.append(("POST", "/v1/completions", a, {"model": "gpt-test", "prompt": "hi"}))

    try:
        async with aiohttp.ClientSession() as session:
            for method, path, headers, body in requests:
                kwargs: dict[str, Any] = {"headers": headers}
                if isinstance(body, bytes):
                    kwargs["data"] = body
                elif body is not None:
                    kwargs["json"] = body
                async with session.request(method, url + path, **kwargs) as resp:
                    raw = await resp.read()
                    answer = raw.decode(errors="replace")
                    seen.append(f"{method} {path} -> {resp.status} {dict(resp.headers)!r} {answer}")
            async with session.get(url + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}) as resp:
                assert resp.status == 200
                metrics_text = await resp.text()
                seen.append(metrics_text)
    finally:
        await runner.cleanup()

    # The run did go through the paths it claims to.
    assert any(" -> 502 " in line for line in seen)  # upstream 401 relayed as 502
    assert any(" -> 429 " in line for line in seen)
    assert any(" -> 403 " in line for line in seen)
    assert any("[redacted]" in line for line in seen)  # an echoed secret was caught, not just absent
    assert "gateway_ratelimit_store_degraded 1.0" in metrics_text  # the (unreachable) Redis path ran
    assert any("rate-limit store" in line for line in all_logs.lines)
    assert any('"event":"completion"' in line for line in all_logs.lines)  # the audit log ran
    assert any("gateway.access" in line for line in all_logs.lines)  # the access log ran
    assert fake_upstream.requests[0].headers["Authorization"] == f"Bearer {UPSTREAM_KEY}"  # it was sent, upstream

    places = {"client-visible output": "\n".join(seen), "logs": "\n".join(all_logs.lines)}
    for what, secret in SECRETS.items():
        for where, text in places.items():
            assert secret not in text, f"the {what} appears in the {where}"


def test_config_errors_never_echo_secrets() -> None:
    secret = "sk-this-must-not-appear-0001"
    text = f"""backends:
  - {{name: up, type: openai, base_url: 'http://x/v1', api_key: {{nested: {secret}}}}}
models: [{{name: m, routes: [{{backend: up, model: m}}]}}]
auth:
  store: 'http://user:{secret}@host'
  keys:
    - {{name: a, key: {secret}, rpm: '{secret}'}}
    - {{name: b, key: [{secret}]}}
  metrics_key: {{x: {secret}}}
"""
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={})
    assert len(info.value.problems) >= 4
    assert secret not in str(info.value)
    assert secret not in orjson.dumps(info.value.problems).decode()
