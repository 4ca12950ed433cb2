"""How config problems are reported (gateway.config_report): positions, values shown or hidden,
the nearest valid name, every problem of the file in one run."""

from __future__ import annotations

import pytest

from gateway.config_report import ConfigError, Positions
from gateway.configfile import parse_config

BASE = """\
server:
  port: 8080
backends:
  - name: up
    type: openai
    base_url: http://up/v1
    api_key: ${KEY}
  - {name: sim, type: mock}
models:
  - name: m
    routes:
      - {backend: sim, model: x}
"""
ENV = {"KEY": "sk-live-0123456789abcdef"}


def error(text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", ENV if env is None else env)
    return info.value


def edit(old: str, new: str, text: str = BASE) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_positions_of_keys_values_and_missing_paths() -> None:
    positions = Positions(BASE)
    assert positions.of("server.port") == (2, 9)  # a scalar: its value
    assert positions.of("server.port", key=True) == (2, 3)
    assert positions.of("server") == (1, 1)  # a block: its key's line
    assert positions.of("backends[1].name") == (8, 12)  # inside a flow mapping
    assert positions.of("backends[0].timeout.connect") == (4, 5)  # missing: the nearest enclosing entry
    assert positions.of("") == (1, 1)


def test_a_schema_error_and_a_broken_reference_in_one_run() -> None:
    text = edit("port: 8080", "port: eighty")
    text = edit("{backend: sim, model: x}", "{backend: smi, model: x}", text)
    assert error(text).lines() == [
        "gw.yaml:2:9: server.port: Input should be a valid integer, unable to parse string as an integer "
        "(got 'eighty')",
        "gw.yaml:12:19: models[0].routes[0].backend: no backend named 'smi'; did you mean 'sim'? (defined: sim, up)",
    ]


def test_every_cross_reference_at_once() -> None:
    text = edit("{backend: sim, model: x}", "{backend: simm, model: x}\n      - {backend: upp, model: y}")
    text += "  - {name: m, routes: [{backend: sim, model: z}]}\n"
    assert [p for p, _ in error(text).problems] == [
        "models[0].routes[0].backend",
        "models[0].routes[1].backend",
        "models[1].name",
    ]


def test_a_secret_value_is_never_shown() -> None:
    # A key where a number belongs, and an api_key of the wrong kind: neither value is echoed.
    text = edit("port: 8080", "port: sk-live-0123456789abcdef")
    text = edit("    api_key: ${KEY}\n", "    api_key: ${KEY}\n    max_connections: ${KEY}\n", text)
    text = edit(
        "{name: sim, type: mock}", "{name: sim, type: mock}\n  - {name: x, type: openai, base_url: 'ftp://x'}", text
    )
    found = error(text)
    assert "0123456789abcdef" not in str(found)
    assert "got a secret value, not shown" in str(found)


def test_a_literal_with_no_near_choice_lists_them() -> None:
    text = edit("  - name: m\n", "  - name: m\n    strategy: fastest\n")
    [(path, message)] = error(text).problems
    assert path == "models[0].strategy"
    assert message == ("Input should be 'failover', 'round_robin', 'weighted' or 'least_outstanding' (got 'fastest')")


def test_an_unknown_key_of_a_backend_type_suggests_that_types_keys() -> None:
    text = edit("    base_url: http://up/v1\n", "    base_url: http://up/v1\n    chat_max_token_field: max_tokens\n")
    assert error(text).lines() == [
        "gw.yaml:7:5: backends[0].chat_max_token_field: unknown key; did you mean 'chat_max_tokens_field'?"
    ]


def test_a_missing_variable_is_not_reported_twice() -> None:
    # The empty value it leaves would fail the port's own check as well: one problem, the variable.
    text = edit("port: 8080", "port: ${PORT}")
    assert error(text).problems == [("server.port", "environment variable PORT is not set")]


def test_yaml_anchors_and_merge_keys_keep_positions() -> None:
    text = edit(
        "  - {name: sim, type: mock}\n", "  - &sim {name: sim, type: mock}\n  - {<<: *sim, name: sim2, colour: 1}\n"
    )
    assert error(text).lines() == [
        "gw.yaml:9:28: backends[2].colour: unknown key (expected one of: " + _mock_keys() + ")"
    ]


def _mock_keys() -> str:
    from schemas.config import MockBackendConfig

    return ", ".join(MockBackendConfig.model_fields)
