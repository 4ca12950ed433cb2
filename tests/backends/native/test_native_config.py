"""The ``tgi``, ``ollama`` and ``llamacpp`` backend entries: validated at load, built by the registry."""

from __future__ import annotations

import pytest

from backends.native.llamacpp import LlamaCppBackend
from backends.native.ollama import OllamaBackend
from backends.native.tgi import TGIBackend
from backends.registry import build_backends
from gateway.configfile import ConfigError, parse_config

BASE = """backends:
  - name: t
    type: tgi
    base_url: http://tgi:8080
    api_key: secret-1
  - name: o
    type: ollama
    base_url: http://ollama:11434
    capabilities: {logit_bias: emulated}
  - name: l
    type: llamacpp
    base_url: http://llama:8081
    timeout: {connect: 1, first_byte: 30, total: 60, stream_idle: 30}
    transport: aiohttp
models:
  - name: m
    routes: [{backend: t, model: x}, {backend: o, model: llama3.2}, {backend: l, model: y}]
"""


def test_native_entries_load_and_build() -> None:
    config = parse_config(BASE, "<test>", env={})
    backends = build_backends(config.backends)
    assert [type(b) for b in backends.values()] == [TGIBackend, OllamaBackend, LlamaCppBackend]
    assert backends["o"].capabilities.level("logit_bias").value == "emulated"
    assert "secret-1" not in repr(config.backends[0])


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("base_url: http://tgi:8080", "base_url: http://tgi:8080/?x=1"), "query string"),
        (("    transport: aiohttp\n", "    transport: aiohttp\n    stream_usage: true\n"), "stream_usage"),
        (("    base_url: http://ollama:11434\n", ""), "base_url"),
    ],
)
def test_native_entries_refuse_bad_keys(edit: tuple[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE.replace(*edit), "<test>", env={})
    assert problem in str(caught.value)
