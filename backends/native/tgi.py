"""Hugging Face text-generation-inference (TGI), native ``POST /generate`` and ``/generate_stream``.

Request (``{"inputs": prompt, "parameters": {...}}``), defaults made explicit:

- ``max_new_tokens`` always set (OpenAI's 16 when unset); TGI's own default is the rest of
  the context;
- sampling: TGI samples only when told to. ``temperature: 0`` (or ``top_p: 0``, which
  keeps only the most likely token) -> ``do_sample: false`` and no sampling values;
  otherwise ``do_sample: true`` with ``temperature`` (1 when unset). ``top_p`` is sent only
  below 1 (TGI refuses 1.0), ``top_k`` only when on;
- ``seed`` (an OpenAI int64) as TGI's u64, two's complement for negative seeds;
- ``details: true`` always: without it a stream has no finish reason and no counts;
  ``top_n_tokens`` for ``logprobs > 0``;
- guided_json / guided_regex -> ``grammar`` of type ``json`` / ``regex``; guided_choice ->
  a ``regex`` alternation of the escaped choices; a JSON ``response_format`` -> a ``json``
  grammar (``json_object``: ``{"type": "object"}``).

Response: ``finish_reason`` ``length`` -> ``length``, ``eos_token`` / ``stop_sequence`` ->
``stop``; TGI keeps the stop sequence in the text, so the gateway cuts it
(``strips_stop = False``). Usage: ``details.generated_tokens``; prompt tokens from the
``x-prompt-tokens`` header (non-streaming) or ``details.input_length`` (stream). Special
tokens (EOS) are left out of logprobs, as they are out of the text.

Errors: 422 validation -> 400; 424 generation error -> 502 (retryable elsewhere);
429 overloaded -> 429; stream ``data:{"error": ...}`` -> the stream's error event.
"""

from __future__ import annotations

from typing import Any, ClassVar

from backends.base import ResponsesTable, TokenUsage
from backends.emulation.best_of import is_greedy
from backends.errors import UpstreamProtocolError, UpstreamStatusError, error_from_upstream_body
from backends.native.base import NativeBackend
from backends.native.common import (
    Event,
    Generation,
    TokenLogprob,
    count,
    finish_of,
    json_constraint,
    stops_of,
    upstream_failed,
    upstream_max_tokens,
)
from backends.native.tgi_capabilities import TGI_CAPABILITIES, TGI_RESPONSES
from backends.native.tgi_chat import TGIChat
from schemas.completions import CompletionRequest
from schemas.config import TGIBackendConfig

__all__ = ["TGIBackend", "choice_regex"]


_FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
_REGEX_META = frozenset("\\.^$|?*+()[]{}/")


def choice_regex(choices: list[str]) -> str:
    """``guided_choice`` as a regex that matches exactly one of the choices."""
    escaped = ("".join("\\" + ch if ch in _REGEX_META else ch for ch in choice) for choice in choices)
    return "(" + "|".join(escaped) + ")"


def _token(obj: Any, top: Any) -> TokenLogprob | None:
    """A TGI ``Token`` (None for special tokens such as EOS, which are not in the text)."""
    if not isinstance(obj, dict) or obj.get("special"):
        return None
    alternatives = None
    if isinstance(top, list):
        alternatives = {
            str(t.get("text", "")): float(t["logprob"])
            for t in top
            if isinstance(t, dict) and not t.get("special") and isinstance(t.get("logprob"), int | float)
        }
    logprob = obj.get("logprob")
    return TokenLogprob(
        str(obj.get("text", "")), float(logprob) if isinstance(logprob, int | float) else None, alternatives
    )


class TGIBackend(NativeBackend):
    kind: ClassVar[str] = "tgi"
    default_capabilities = TGI_CAPABILITIES
    chat_translator = TGIChat
    responses_capabilities: ResponsesTable | None = TGI_RESPONSES  # through its chat translator
    complete_path = "/generate"
    stream_path = "/generate_stream"
    health_path = "/health"
    framing = "sse"
    strips_stop = False

    def __init__(self, config: TGIBackendConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)

    def payload(self, request: CompletionRequest, model: str, *, stream: bool) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": upstream_max_tokens(request),
            "details": True,
            "return_full_text": False,
        }
        if is_greedy(request.temperature) or request.top_p == 0:
            params["do_sample"] = False
        else:
            params["do_sample"] = True
            params["temperature"] = 1.0 if request.temperature is None else request.temperature
            if request.top_p is not None and request.top_p < 1:
                params["top_p"] = request.top_p
            if request.top_k is not None and request.top_k > 0:
                params["top_k"] = request.top_k
            if request.seed is not None:
                params["seed"] = request.seed % 2**64
        if request.repetition_penalty is not None:
            params["repetition_penalty"] = request.repetition_penalty
        if request.frequency_penalty:
            params["frequency_penalty"] = request.frequency_penalty
        stops = stops_of(request)
        if stops:
            params["stop"] = stops
        if request.logprobs:
            params["top_n_tokens"] = request.logprobs
        schema = json_constraint(request)
        if schema is not None:
            params["grammar"] = {"type": "json", "value": schema}
        elif request.guided_regex is not None:
            params["grammar"] = {"type": "regex", "value": request.guided_regex}
        elif request.guided_choice is not None:
            params["grammar"] = {"type": "regex", "value": choice_regex(request.guided_choice)}
        return {"inputs": request.prompt, "parameters": params}

    def status_error(self, status: int, data: bytes, retry_after: str | None) -> UpstreamStatusError:
        if status == 424:  # a generation error: the server failed, not the request
            error = error_from_upstream_body(502, data, retry_after, self.name)
            error.reason = "status_424"
            return error
        return super().status_error(status, data, retry_after)

    def generation(self, obj: Any, header: Any) -> Generation:
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]
        details = obj.get("details") if isinstance(obj, dict) else None
        if not isinstance(details, dict) or not isinstance(obj.get("generated_text"), str):
            raise UpstreamProtocolError("TGI sent an answer without generated_text and details", backend=self.name)
        tops = details.get("top_tokens") or []
        tokens = []
        for i, raw in enumerate(details.get("tokens") or []):
            token = _token(raw, tops[i] if i < len(tops) else None)
            if token is not None:
                tokens.append(token)
        prompt_tokens = header("x-prompt-tokens")
        prompt = (
            count(int(prompt_tokens)) if prompt_tokens and prompt_tokens.isascii() and prompt_tokens.isdigit() else None
        )
        usage = TokenUsage(
            len(details.get("prefill") or ()) if prompt is None else prompt,
            count(details.get("generated_tokens")) or 0,
        )
        finish = finish_of(_FINISH, details.get("finish_reason"), self.name)
        return Generation(obj["generated_text"], tokens, finish, usage)

    def event(self, obj: dict[str, Any]) -> Event | None:
        if "error" in obj:
            raise upstream_failed(self.name, obj)
        if "token" not in obj:  # every TGI stream event carries one: anything else is not TGI's
            raise UpstreamProtocolError("the upstream sent a stream event without a token", backend=self.name)
        token = _token(obj.get("token"), obj.get("top_tokens"))
        text = token.text if token is not None else ""
        tokens = [token] if token is not None else []
        details = obj.get("details")
        if not isinstance(details, dict):
            return Event(text, tokens)
        usage = TokenUsage(count(details.get("input_length")) or 0, count(details.get("generated_tokens")) or 0)
        return Event(text, tokens, finish_of(_FINISH, details.get("finish_reason"), self.name), usage)
