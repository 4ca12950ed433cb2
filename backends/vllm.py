"""Adapter for a remote vLLM OpenAI-compatible server.

vLLM speaks OpenAI's wire format plus its own sampling extras, so every field
of our schema is forwarded. Health is vLLM's own ``/health`` at the server root.
"""

from __future__ import annotations

from typing import ClassVar

from backends.capabilities import Capabilities, Level
from backends.openai import OpenAIBackend

__all__ = ["VLLM_CAPABILITIES", "VLLMBackend"]

VLLM_CAPABILITIES = Capabilities.of(Level.NATIVE)


class VLLMBackend(OpenAIBackend):
    kind: ClassVar[str] = "vllm"
    default_capabilities: ClassVar[Capabilities] = VLLM_CAPABILITIES

    def health_url(self) -> str:
        root = self.base_url.removesuffix("/v1")
        return root + "/health"
