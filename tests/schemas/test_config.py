"""The YAML config: parse_config / load_config, with every problem reported at its YAML path."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.configfile import ConfigError, load_config, parse_config
from schemas.config import (
    BACKEND_TYPES,
    BackendConfig,
    GatewayConfig,
    MockBackendConfig,
    OpenAIBackendConfig,
    VLLMBackendConfig,
)

SECRET = "sk-test-0123456789abcdef"
ENV = {"OPENAI_API_KEY": SECRET}

FULL = """\
server:
  host: 0.0.0.0
  port: 8080
backends:
  - name: openai
    type: openai
    base_url: https://api.openai.com/v1
    api_key: ${OPENAI_API_KEY}
  - name: local-vllm
    type: vllm
    base_url: http://127.0.0.1:8000/v1
    timeout:
      first_byte: 30
  - name: sim
    type: mock
    token_delay_ms: 5
models:
  - name: gpt-3.5-turbo-instruct
    routes:
      - backend: openai
        model: gpt-3.5-turbo-instruct
  - name: qwen
    strategy: round_robin
    routes:
      - {backend: local-vllm, model: Qwen/Qwen2.5-0.5B-Instruct}
      - {backend: sim, model: qwen-sim}
"""


def edit(old: str, new: str, text: str = FULL) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def problems(text: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "test.yaml", ENV if env is None else env)
    assert info.value.source == "test.yaml"
    assert info.value.problems
    return info.value.problems


def only_problem(text: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    [problem] = problems(text, env)
    return problem


# --- a valid config -----------------------------------------------------------------------


def test_full_config() -> None:
    config = parse_config(FULL, "test.yaml", ENV)
    assert (config.server.host, config.server.port) == ("0.0.0.0", 8080)
    openai, vllm, sim = config.backends
    assert isinstance(openai, OpenAIBackendConfig)
    assert isinstance(vllm, VLLMBackendConfig)
    assert isinstance(sim, MockBackendConfig)
    assert openai.api_key is not None and openai.api_key.get_secret_value() == SECRET
    assert str(openai.base_url) == "https://api.openai.com/v1"
    assert vllm.api_key is None
    assert vllm.timeout.first_byte == 30 and vllm.timeout.connect == 5.0
    assert sim.token_delay_ms == 5
    assert [m.name for m in config.models] == ["gpt-3.5-turbo-instruct", "qwen"]
    assert config.models[0].strategy == "failover"
    assert config.models[1].strategy == "round_robin"
    assert [(r.backend, r.model) for r in config.models[1].routes] == [
        ("local-vllm", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("sim", "qwen-sim"),
    ]
    assert config.backend("sim") is sim
    with pytest.raises(KeyError):
        config.backend("nope")


def test_server_section_is_optional() -> None:
    config = parse_config(edit("server:\n  host: 0.0.0.0\n  port: 8080\n", ""), env=ENV)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8080)


def test_capability_override() -> None:
    text = edit("    token_delay_ms: 5\n", "    capabilities: {top_k: native, best_of: unsupported}\n")
    sim = parse_config(text, env=ENV).backend("sim")
    assert sim.capabilities == {"top_k": "native", "best_of": "unsupported"}


# --- environment interpolation ---------------------------------------------------------------


def test_env_interpolation_inside_strings_and_for_numbers() -> None:
    text = edit("http://127.0.0.1:8000/v1", "http://${VLLM_HOST}:${VLLM_PORT}/v1")
    text = edit("port: 8080", "port: ${PORT}", text)
    config = parse_config(text, env={**ENV, "VLLM_HOST": "10.0.0.7", "VLLM_PORT": "9000", "PORT": "9090"})
    assert str(config.backend("local-vllm").base_url) == "http://10.0.0.7:9000/v1"  # type: ignore[union-attr]
    assert config.server.port == 9090


def test_env_values_are_not_interpolated_again() -> None:
    config = parse_config(FULL, env={"OPENAI_API_KEY": "${OTHER}"})
    assert config.backend("openai").api_key.get_secret_value() == "${OTHER}"  # type: ignore[union-attr]


def test_env_defaults_to_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-process")
    config = parse_config(FULL)
    assert config.backend("openai").api_key.get_secret_value() == "sk-from-process"  # type: ignore[union-attr]
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError):
        parse_config(FULL)


def test_missing_env_var_reported_at_its_path() -> None:
    assert only_problem(FULL, env={}) == ("backends[0].api_key", "environment variable OPENAI_API_KEY is not set")


def test_every_missing_env_var_reported() -> None:
    text = edit("model: qwen-sim}", 'model: "${SIM_MODEL}"}')
    assert problems(text, env={}) == [
        ("backends[0].api_key", "environment variable OPENAI_API_KEY is not set"),
        ("models[1].routes[1].model", "environment variable SIM_MODEL is not set"),
    ]


# --- unknown keys, types and names --------------------------------------------------------------

ROOT_KEYS = f"unknown key (expected one of: {', '.join(GatewayConfig.model_fields)})"
MOCK_KEYS = "name, capabilities, max_concurrency, retry, circuit_breaker, health_check, type, token_delay_ms, ..."
UNKNOWN_KEYS = [
    ("root", ("server:\n", "bogus: 1\nserver:\n"), "bogus",
     "unknown key (expected one of: server, backends, models, ..."),
    ("server", ("  port: 8080\n", "  port: 8080\n  hots: x\n"), "server.hots", "unknown key; did you mean 'host'?"),
    ("backend", ("    token_delay_ms: 5\n", "    token_delay_ms: 5\n    colour: red\n"), "backends[2].colour",
     f"unknown key (expected one of: {MOCK_KEYS}"),
    ("backend-http", ("    api_key: ${OPENAI_API_KEY}\n", "    api_key: ${OPENAI_API_KEY}\n    apikey: x\n"),
     "backends[0].apikey", "unknown key; did you mean 'api_key'?"),
    ("timeout", ("      first_byte: 30\n", "      first_byte: 30\n      read: 3\n"), "backends[1].timeout.read",
     "unknown key (expected one of: connect, first_byte, total, stream_idle)"),
    ("key-named-like-type", ("    token_delay_ms: 5\n", "    token_delay_ms: 5\n    mock: true\n"), "backends[2].mock",
     f"unknown key (expected one of: {MOCK_KEYS}"),
    ("model", ("    strategy: round_robin\n", "    strategy: round_robin\n    retries: 3\n"), "models[1].retries",
     "unknown key (expected one of: name, routes, strategy, endpoints, ..."),
    ("route", ("model: qwen-sim}", "model: qwen-sim, weigth: 2}"), "models[1].routes[1].weigth",
     "unknown key; did you mean 'weight'?"),
    ("int-key", ("server:\n", "8080: x\nserver:\n"), "8080", "Keys should be strings (got 8080)"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "path", "said"), [u[1:] for u in UNKNOWN_KEYS], ids=[u[0] for u in UNKNOWN_KEYS])
def test_unknown_key_reported_at_its_path_with_the_nearest_valid_one(
    change: tuple[str, str], path: str, said: str
) -> None:
    where, message = only_problem(edit(*change))
    assert where == path
    # "..." ends a list of valid keys that other sections may grow
    assert message.startswith(said.removesuffix("...")) if said.endswith("...") else message == said


def test_all_unknown_keys_reported_at_once() -> None:
    text = edit("server:\n", "bogus: 1\nserver:\n  hots: x\n")
    text = edit("model: qwen-sim}", "model: qwen-sim, weigth: 2}", text)
    assert sorted(problems(text)) == [
        ("bogus", ROOT_KEYS),
        ("models[1].routes[1].weigth", "unknown key; did you mean 'weight'?"),
        ("server.hots", "unknown key; did you mean 'host'?"),
    ]


def test_unknown_backend_type() -> None:
    assert only_problem(edit("type: mock", "type: nope")) == (
        "backends[2].type",
        f"unknown backend type 'nope' (one of {', '.join(BACKEND_TYPES)})",
    )
    assert only_problem(edit("type: mock", "type: mokc")) == (
        "backends[2].type",
        "unknown backend type 'mokc'; did you mean 'mock'?",
    )


def test_missing_backend_type() -> None:
    assert only_problem(edit("    type: mock\n", "")) == (
        "backends[2]",
        f"missing 'type' (one of {', '.join(BACKEND_TYPES)})",
    )


def test_backend_types_list_every_member_of_the_union() -> None:
    # The error messages above list BACKEND_TYPES; it must name every configurable type.
    from typing import get_args

    union = get_args(get_args(BackendConfig)[0])
    assert sorted(BACKEND_TYPES) == sorted(get_args(m.model_fields["type"].annotation)[0] for m in union)


def test_duplicate_backend_name() -> None:
    text = edit("name: sim", "name: openai")
    # The route to the renamed 'sim' is reported with it, in the same run.
    assert problems(text) == [
        ("backends[2].name", "duplicate backend name 'openai' (first at backends[0])"),
        ("models[1].routes[1].backend", "no backend named 'sim' (defined: local-vllm, openai)"),
    ]


def test_duplicate_model_name() -> None:
    text = edit("name: qwen", "name: gpt-3.5-turbo-instruct")
    assert only_problem(text) == (
        "models[1].name",
        "duplicate model name 'gpt-3.5-turbo-instruct' (first at models[0])",
    )


def test_duplicate_key_name() -> None:
    text = (
        "backends: [{name: sim, type: mock}]\n"
        "models: [{name: m1, routes: [{backend: sim, model: x}]}]\n"
        "auth: {keys: [{name: team, key: aaaaaaaaaaaaaaaa-1}, {name: team, key: bbbbbbbbbbbbbbbb-2}]}\n"
    )
    assert only_problem(text) == ("auth.keys[1].name", "duplicate key name 'team' (first at auth.keys[0])")


def test_route_to_undefined_backend() -> None:
    path, message = only_problem(edit("backend: sim", "backend: tgi-box"))
    assert path == "models[1].routes[1].backend"
    assert message.startswith("no backend named 'tgi-box'")


def test_bad_capability_override_key() -> None:
    text = edit("    token_delay_ms: 5\n", "    capabilities: {top_kk: native}\n")
    assert only_problem(text) == ("backends[2].capabilities", "unknown request field 'top_kk'; did you mean 'top_k'?")


def test_bad_capability_level() -> None:
    path, message = only_problem(edit("    token_delay_ms: 5\n", "    capabilities: {top_k: maybe}\n"))
    assert path == "backends[2].capabilities.top_k"
    assert "native" in message


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (("port: 8080", "port: 70000"), "server.port"),
        (("https://api.openai.com/v1", "not a url"), "backends[0].base_url"),
        (("https://api.openai.com/v1", "https://api.openai.com/v1?x=1"), "backends[0].base_url"),
        (("strategy: round_robin", "strategy: random"), "models[1].strategy"),
        (("model: qwen-sim}", "model: qwen-sim, weight: 0}"), "models[1].routes[1].weight"),
        (("      first_byte: 30\n", "      first_byte: -1\n"), "backends[1].timeout.first_byte"),
    ],
)
def test_bad_values_reported_at_their_path(change: tuple[str, str], path: str) -> None:
    assert only_problem(edit(*change))[0] == path


def test_missing_and_empty_sections() -> None:
    found = problems("backends: []\nmodels: [{name: m, routes: [{backend: b, model: x}]}]\n")
    assert [p for p, _ in found] == ["backends", "models[0].routes[0].backend"]
    found = problems("server: {}\n")
    assert sorted(p for p, _ in found) == ["backends", "models"]


# --- not a config at all ------------------------------------------------------------------------


def test_invalid_yaml() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("backends: [1, 2\nmodels: x\n", "test.yaml", ENV)
    [(path, message)] = info.value.problems
    assert path == ""
    assert message.startswith("invalid YAML")
    assert info.value.lines()[0].startswith("test.yaml:2:7: <root>: invalid YAML")


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n", "42\n", "null\n"])
def test_non_mapping_yaml(text: str) -> None:
    assert only_problem(text)[0] == ""


# --- secrets --------------------------------------------------------------------------------------


def test_secrets_never_shown() -> None:
    text = edit(
        "    api_key: ${OPENAI_API_KEY}\n",
        "    api_key: ${OPENAI_API_KEY}\n    headers: {OpenAI-Organization: org-hidden}\n",
    )
    config = parse_config(text, env=ENV)
    for shown in (repr(config), str(config), config.model_dump_json(), repr(config.backends[0])):
        assert SECRET not in shown
        assert "org-hidden" not in shown
    assert config.backend("openai").headers["OpenAI-Organization"].get_secret_value() == "org-hidden"  # type: ignore[union-attr]


def test_secret_not_in_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(edit("port: 8080", "port: x"), "test.yaml", ENV)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value.problems)


# --- files ------------------------------------------------------------------------------------------


def test_load_config_reads_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(FULL, encoding="utf-8")
    assert load_config(path, env=ENV).backend("openai").type == "openai"


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env=ENV)
    assert info.value.source == str(path)
    [(where, message)] = info.value.problems
    assert where == ""
    assert message.startswith("cannot read file")


def test_config_error_message_lists_problems() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(FULL, "gw.yaml", {})
    text = str(info.value)
    assert text.startswith("gw.yaml: 1 problem(s)")
    assert "backends[0].api_key: environment variable OPENAI_API_KEY is not set" in text
