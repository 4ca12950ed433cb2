"""Ollama, native ``POST /api/generate`` (NDJSON when streaming).

Request, defaults made explicit (Ollama's own: unlimited tokens, temperature 0.8,
top_p 0.9, top_k 40, repeat_penalty 1.1, streaming on, the model's prompt template):

- ``raw: true`` (the prompt is sent as written, no template) and ``stream`` always set;
  with ``suffix`` the template is what places the suffix (Ollama's fill-in-the-middle),
  so ``raw`` is false then and Ollama answers 400 for a model without that capability;
- ``options``: ``num_predict`` (16 when unset), ``temperature`` 1, ``top_p`` 1, ``top_k`` 0
  (off), ``min_p`` 0, ``repeat_penalty`` 1 and both penalties 0 unless the client set them;
  ``stop``; ``seed`` as a non-negative 32-bit value (Ollama reads -1 as "random");
- ``logprobs: true`` + ``top_logprobs: k`` when the client asked for logprobs;
- ``guided_json`` or a ``json_schema`` ``response_format`` -> ``format`` (a JSON Schema);
  ``json_object`` -> ``format: "json"``. Ollama has no regex or grammar.

Response: ``done_reason`` ``stop`` -> ``stop``, ``length`` -> ``length``; Ollama removes
stop sequences itself. Usage: ``prompt_eval_count`` and ``eval_count`` (omitted when 0).
Errors: ``{"error": "..."}`` with the HTTP status, or as an NDJSON line mid-stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from backends.base import ResponsesTable, TokenUsage
from backends.errors import UpstreamProtocolError
from backends.native.base import NativeBackend
from backends.native.common import (
    Event,
    Generation,
    TokenLogprob,
    count,
    explicit_sampling,
    fit_tokens,
    json_constraint,
    logprob_tokens,
    native_seed,
    ollama_finish,
    stops_of,
    upstream_failed,
    upstream_max_tokens,
)
from backends.native.ollama_capabilities import OLLAMA_CAPABILITIES, OLLAMA_EMBEDDINGS, OLLAMA_RESPONSES
from backends.native.ollama_chat import OllamaChat
from backends.native.ollama_embed import ollama_embed_answer, ollama_embed_payload
from backends.native.pooling import PartVectors
from backends.pooling_capabilities import PoolingCapabilities
from schemas.completions import CompletionRequest
from schemas.config import OllamaBackendConfig
from schemas.embeddings import EmbeddingRequest

__all__ = ["OllamaBackend"]


class OllamaBackend(NativeBackend):
    kind: ClassVar[str] = "ollama"
    default_capabilities = OLLAMA_CAPABILITIES
    chat_translator = OllamaChat
    embedding_capabilities: PoolingCapabilities | None = OLLAMA_EMBEDDINGS
    embed_path = "/api/embed"
    responses_capabilities: ResponsesTable | None = OLLAMA_RESPONSES  # through its chat translator
    complete_path = "/api/generate"
    stream_path = "/api/generate"
    health_path = "/api/version"
    framing = "ndjson"
    strips_stop = True

    def __init__(self, config: OllamaBackendConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)

    def payload(self, request: CompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        options: dict[str, Any] = {
            "num_predict": upstream_max_tokens(request),
            **explicit_sampling(request),
        }
        stops = stops_of(request)
        if stops:
            options["stop"] = stops
        if request.seed is not None:
            options["seed"] = native_seed(request.seed)
        body: dict[str, Any] = {
            "model": model,
            "prompt": request.prompt,
            "raw": not request.suffix,
            "stream": stream,
            "options": options,
        }
        if request.suffix:
            body["suffix"] = request.suffix
        if request.logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = request.logprobs
        fmt = request.response_format
        if fmt is not None and fmt.type == "json_object":
            body["format"] = "json"  # Ollama's own JSON mode, as chat sends it
        else:
            schema = json_constraint(request)
            if schema is not None:
                body["format"] = schema
        return body

    def embed_payload(self, request: EmbeddingRequest, model: str, inputs: Sequence[Any]) -> dict[str, Any]:
        return ollama_embed_payload(request, model, inputs)

    def embed_answer(self, obj: Any, inputs: int) -> PartVectors:
        return ollama_embed_answer(obj, inputs, self.name)

    def _tokens(self, obj: dict[str, Any], text: str) -> list[TokenLogprob] | None:
        tokens = logprob_tokens(obj.get("logprobs"))
        return None if tokens is None else fit_tokens(tokens, len(text))

    def generation(self, obj: Any, header: Any) -> Generation:
        if not isinstance(obj, dict) or not isinstance(obj.get("response"), str) or not obj.get("done"):
            raise UpstreamProtocolError("Ollama sent an answer without response and done", backend=self.name)
        usage = self._usage(obj)
        text = obj["response"]
        return Generation(text, self._tokens(obj, text), ollama_finish(obj, self.name), usage)

    @staticmethod
    def _usage(obj: dict[str, Any]) -> TokenUsage:
        return TokenUsage(count(obj.get("prompt_eval_count")) or 0, count(obj.get("eval_count")) or 0)

    def event(self, obj: dict[str, Any]) -> Event | None:
        if "error" in obj:
            raise upstream_failed(self.name, obj)
        text = obj.get("response")
        text = text if isinstance(text, str) else ""
        if not obj.get("done"):
            return Event(text, self._tokens(obj, text))
        return Event(text, self._tokens(obj, text), ollama_finish(obj, self.name), self._usage(obj))
