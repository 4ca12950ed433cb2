"""Configured upstream ``headers:`` are checked at config load, at their YAML path (issue 13 item 23)."""

from __future__ import annotations

import pytest

from gateway.configfile import ConfigError, parse_config

SECRET_VALUE = "org-secret-value-123"

BASE = """\
backends:
  - name: up
    type: openai
    base_url: http://127.0.0.1:9/v1
{extra}models:
  - name: m
    routes:
      - {{backend: up, model: m}}
"""


def _config(headers: str, api_key: bool = False) -> str:
    extra = "    api_key: sk-upstream-0123456789\n" if api_key else ""
    return BASE.format(extra=extra + f"    headers: {headers}\n")


def _problem(text: str) -> tuple[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", {})
    [problem] = info.value.problems
    assert SECRET_VALUE not in str(info.value)
    return problem


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ("{Host: evil.example}", "'Host'"),
        ('{Content-Length: "12"}', "'Content-Length'"),
        ("{transfer-encoding: chunked}", "'transfer-encoding'"),
        ("{Content-Type: text/plain}", "'Content-Type'"),
        ("{X-Request-Id: abc}", "'X-Request-Id'"),
        ('{"X-Org:": a}', "'X-Org:'"),
        ('{"X Org": a}', "'X Org'"),
        ('{"": a}', "''"),
        ("{X-Org: a, x-org: b}", "'x-org'"),
    ],
)
def test_bad_header_names_fail_the_config_check(headers: str, named: str) -> None:
    path, message = _problem(_config(headers))
    assert path == "backends[0].headers"
    assert named in message


@pytest.mark.parametrize("value", ['"a\\r\\nX-Injected: 1"', '"a\\nb"', '"a\\u0000b"', '"a\\rb"'])
def test_control_characters_in_values_fail_without_echoing_the_value(value: str) -> None:
    path, message = _problem(_config("{X-Org: " + value.replace("a", SECRET_VALUE, 1) + "}"))
    assert path == "backends[0].headers"
    assert "'X-Org'" in message and "control character" in message


def test_authorization_header_and_api_key_conflict() -> None:
    path, message = _problem(_config("{Authorization: Bearer x}", api_key=True))
    assert path == "backends[0]"
    assert "api_key" in message


def test_ordinary_headers_still_load() -> None:
    config = parse_config(
        _config('{OpenAI-Organization: org-1, X-Tab: "a\\tb", Authorization: Basic eA==}'), "gw.yaml", {}
    )
    headers = config.backends[0].headers  # type: ignore[union-attr]
    assert headers["X-Tab"].get_secret_value() == "a\tb"
    assert set(headers) == {"OpenAI-Organization", "X-Tab", "Authorization"}
