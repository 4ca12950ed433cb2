"""The only module that knows every adapter: config entry -> backend instance.

An explicit ``match`` on the config's type; the config schema already refused
unknown types at load, so the fallthrough is a programming error.
"""

from __future__ import annotations

from backends.base import Backend
from backends.mock import MockBackend
from backends.openai import OpenAIBackend
from backends.vllm import VLLMBackend
from schemas.config import BackendConfig, MockBackendConfig, OpenAIBackendConfig, VLLMBackendConfig

__all__ = ["build_backend", "build_backends"]


def build_backend(config: BackendConfig) -> Backend:
    match config:
        case VLLMBackendConfig():
            return VLLMBackend(config)
        case OpenAIBackendConfig():
            return OpenAIBackend(config)
        case MockBackendConfig():
            return MockBackend(config)
    raise AssertionError(f"no adapter for backend type {config.type!r}")


def build_backends(configs: list[BackendConfig]) -> dict[str, Backend]:
    return {config.name: build_backend(config) for config in configs}
