"""``${VAR}`` references in the config as shells and compose read them (gateway.config_env)."""

from __future__ import annotations

import pytest

from gateway.config_env import interpolate
from gateway.configfile import ConfigError, parse_config

ENV = {"SET": "value", "EMPTY": "", "PORT": "9090", "HOST": "10.0.0.7"}

FORMS = [
    ("${SET}", "value"),
    ("${EMPTY}", ""),
    ("${UNSET:-fallback}", "fallback"),
    ("${EMPTY:-fallback}", "fallback"),
    ("${SET:-fallback}", "value"),
    ("${UNSET-fallback}", "fallback"),
    ("${EMPTY-fallback}", ""),
    ("${UNSET:-}", ""),
    ("${SET:?needed}", "value"),
    ("${EMPTY?needed}", ""),
    ("${SET:+other}", "other"),
    ("${EMPTY:+other}", ""),
    ("${EMPTY+other}", "other"),
    ("${UNSET+other}", ""),
    ("http://${HOST}:${PORT:-8000}/v1", "http://10.0.0.7:9090/v1"),
    ("${UNSET:-${HOST}:${PORT}}", "10.0.0.7:9090"),
    ("${UNSET:-a-b:c?d}", "a-b:c?d"),
    ("$${SET} and ${SET}", "${SET} and value"),
    ("cost: $5", "cost: $5"),
    ("no references {SET}", "no references {SET}"),
]


@pytest.mark.parametrize(("text", "expected"), FORMS)
def test_forms(text: str, expected: str) -> None:
    problems: list[str] = []
    assert interpolate(text, ENV, problems) == expected
    assert problems == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("${UNSET}", "environment variable UNSET is not set"),
        ("${UNSET:?set UNSET in .env}", "environment variable UNSET is not set: set UNSET in .env"),
        ("${EMPTY:?must not be empty}", "environment variable EMPTY is empty: must not be empty"),
        ("${UNSET?}", "environment variable UNSET is not set: required"),
        ("${UNSET:-${ALSO_UNSET}}", "environment variable ALSO_UNSET is not set"),
        ("${SET", "a '${' is never closed with '}'"),
        ("${1X}", "'${' is not followed by a variable name"),
        ("${SET/x}", "'${SET' is followed by '/'"),
    ],
)
def test_problems(text: str, problem: str) -> None:
    problems: list[str] = []
    interpolate(text, ENV, problems)
    [found] = problems
    assert found.startswith(problem)


def test_a_default_is_read_only_when_used() -> None:
    problems: list[str] = []
    assert interpolate("${SET:-${UNSET}}", ENV, problems) == "value"
    assert problems == []


def test_values_from_the_environment_are_not_read_again() -> None:
    problems: list[str] = []
    assert interpolate("${A:-x}", {"A": "${SET}"}, problems) == "${SET}"


CONFIG = """\
server:
  port: ${PORT:-8080}
backends:
  - name: sim
    type: mock
    token_delay_ms: ${DELAY:?give DELAY in milliseconds}
models:
  - {name: m, routes: [{backend: sim, model: "${MODEL:-qwen}"}]}
"""


def test_a_config_with_defaults() -> None:
    config = parse_config(CONFIG, env={"DELAY": "3"})
    assert config.server.port == 8080
    assert config.models[0].routes[0].model == "qwen"
    assert parse_config(CONFIG, env={"DELAY": "3", "PORT": "9090"}).server.port == 9090


def test_a_required_variable_is_one_problem_at_its_place() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG, "gw.yaml", env={})
    assert info.value.problems == [
        ("backends[0].token_delay_ms", "environment variable DELAY is not set: give DELAY in milliseconds")
    ]
    assert info.value.lines() == [
        "gw.yaml:6:21: backends[0].token_delay_ms: environment variable DELAY is not set: give DELAY in milliseconds"
    ]
