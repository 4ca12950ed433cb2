"""llama.cpp's ``llama-server``, native ``POST /completion`` (SSE when streaming).

Request, defaults made explicit (llama.cpp's own: unlimited tokens, temperature 0.8,
top_p 0.95, top_k 40, min_p 0.05):

- ``n_predict`` (16 when unset), ``temperature`` 1 (0 is greedy), ``top_p`` 1, ``top_k`` 0
  (off), ``min_p`` 0, ``repeat_penalty`` 1 and both penalties 0 unless the client set them;
- ``prompt`` as text or token ids (llama.cpp takes both); echoing a token-id prompt
  asks ``POST /detokenize`` for its text;
- ``seed`` as a non-negative 32-bit value (llama.cpp reads -1 as "random");
- ``n_probs`` for logprobs (at least 1: with 0 llama.cpp returns no probabilities at all);
- ``logit_bias`` as ``[[token_id, bias], ...]``, ``ignore_eos``;
- guided_json, or a JSON ``response_format`` (``json_object``: ``{"type": "object"}``) ->
  ``json_schema``; guided_choice -> a GBNF ``grammar`` alternation;
  guided_grammar -> ``grammar`` as written (it must be GBNF, llama.cpp's dialect).

Response: ``stop_type`` ``eos``/``word`` -> ``stop``, ``limit`` (and ``none``) -> ``length``;
llama.cpp removes the stop sequence and names it (``stopping_word``), which
``include_stop_str_in_output`` puts back. Usage: ``tokens_evaluated`` and
``tokens_predicted``. Errors: ``{"error": {"code", "message", "type"}}``, in the body or
as a ``data:`` event mid-stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from backends.base import ResponsesTable, TokenUsage, UpstreamCall
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
    logit_bias_pairs,
    logprob_tokens,
    native_seed,
    stops_of,
    upstream_failed,
    upstream_max_tokens,
)
from backends.native.llamacpp_capabilities import LLAMACPP_CAPABILITIES, LLAMACPP_EMBEDDINGS, LLAMACPP_RESPONSES
from backends.native.llamacpp_chat import LlamaCppChat
from backends.native.llamacpp_embed import llamacpp_embed_answer, llamacpp_embed_payload
from backends.native.pooling import PartVectors
from backends.pooling_capabilities import PoolingCapabilities
from schemas.completions import CompletionRequest
from schemas.config import LlamaCppBackendConfig
from schemas.embeddings import EmbeddingRequest

__all__ = ["LlamaCppBackend", "choice_grammar"]


_FINISH = {"eos": "stop", "word": "stop", "limit": "length", "none": "length"}
_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_GBNF_ESCAPES.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x20 else ch) for ch in text) + '"'


def choice_grammar(choices: list[str]) -> str:
    """``guided_choice`` as a GBNF grammar that matches exactly one of the choices."""
    return "root ::= " + " | ".join(_gbnf_literal(choice) for choice in choices)


class LlamaCppBackend(NativeBackend):
    kind: ClassVar[str] = "llamacpp"
    default_capabilities = LLAMACPP_CAPABILITIES
    chat_translator = LlamaCppChat
    embedding_capabilities: PoolingCapabilities | None = LLAMACPP_EMBEDDINGS
    embed_path = "/v1/embeddings"
    responses_capabilities: ResponsesTable | None = LLAMACPP_RESPONSES  # through its chat translator
    complete_path = "/completion"
    stream_path = "/completion"
    health_path = "/health"
    framing = "sse"
    strips_stop = True

    def __init__(self, config: LlamaCppBackendConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)

    def embed_payload(self, request: EmbeddingRequest, model: str, inputs: Sequence[Any]) -> dict[str, Any]:
        return llamacpp_embed_payload(model, inputs)

    def embed_answer(self, obj: Any, inputs: int) -> PartVectors:
        return llamacpp_embed_answer(obj, inputs, self.name)

    def payload(self, request: CompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "n_predict": upstream_max_tokens(request),
            **explicit_sampling(request),
            "stream": stream,
        }
        stops = stops_of(request)
        if stops:
            body["stop"] = stops
        if request.seed is not None:
            body["seed"] = native_seed(request.seed)
        if request.logprobs is not None:
            body["n_probs"] = max(request.logprobs, 1)
        if request.logit_bias:
            body["logit_bias"] = logit_bias_pairs(request.logit_bias)
        if request.ignore_eos:
            body["ignore_eos"] = True
        schema = json_constraint(request)
        if schema is not None:
            body["json_schema"] = schema
        elif request.guided_choice is not None:
            body["grammar"] = choice_grammar(request.guided_choice)
        elif request.guided_grammar is not None:
            body["grammar"] = request.guided_grammar
        return body

    async def echo_text(self, request: CompletionRequest, call: UpstreamCall) -> str:
        if isinstance(request.prompt, str):
            return request.prompt
        obj, _ = await self.post_json("/detokenize", {"tokens": request.prompt}, call)
        if not isinstance(obj, dict) or not isinstance(obj.get("content"), str):
            raise UpstreamProtocolError("llama.cpp sent a /detokenize answer without content", backend=self.name)
        return str(obj["content"])

    @staticmethod
    def _usage(obj: dict[str, Any]) -> TokenUsage:
        return TokenUsage(count(obj.get("tokens_evaluated")) or 0, count(obj.get("tokens_predicted")) or 0)

    @staticmethod
    def _tokens(obj: dict[str, Any], text: str) -> list[TokenLogprob] | None:
        tokens = logprob_tokens(obj.get("completion_probabilities"))
        return None if tokens is None else fit_tokens(tokens, len(text))

    def generation(self, obj: Any, header: Any) -> Generation:
        if not isinstance(obj, dict) or not isinstance(obj.get("content"), str):
            raise UpstreamProtocolError("llama.cpp sent an answer without content", backend=self.name)
        text = obj["content"]
        finish = _FINISH.get(str(obj.get("stop_type")), "length")
        stop_word = str(obj.get("stopping_word") or "")
        return Generation(text, self._tokens(obj, text), finish, self._usage(obj), stop_word)

    def event(self, obj: dict[str, Any]) -> Event | None:
        if "error" in obj:
            raise upstream_failed(self.name, obj)
        text = obj.get("content")
        if not isinstance(text, str):
            # Only the final event may come without text; any other is not llama.cpp's.
            if text is not None or not obj.get("stop"):
                raise UpstreamProtocolError("the upstream sent a stream event without text content", backend=self.name)
            text = ""
        tokens = self._tokens(obj, text)
        if not obj.get("stop"):
            return Event(text, tokens)
        finish = _FINISH.get(str(obj.get("stop_type")), "length")
        return Event(text, tokens, finish, self._usage(obj), str(obj.get("stopping_word") or ""))
