"""Pieces shared by the native-API translators (``tgi``, ``ollama``, ``llamacpp``); no I/O.

A native API answers one prompt with one completion, in its own shape. A translator
turns that into a :class:`Generation` (non-streaming) or a series of :class:`Event`
(streaming), defined here; what is the same for every native API around that lives here
too, except the OpenAI choice built from them (:mod:`backends.native.choice`):

- the request helpers every translator uses (stops, explicit sampling, max_tokens,
  ``guided_json`` or a JSON ``response_format``, seeds, native logprob entries) and the stop-sequence text helpers;
- ids, ``created`` and the answer head;
- Ollama's finish mapping (``ollama_finish``), which both Ollama translators share;
- :class:`NativeCapabilities`: the capability table plus rules that depend on a field's
  *value* (a token-id prompt on a text-only API), so the router refuses those by name too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from backends.base import TokenUsage
from backends.capabilities import EMPTY_PROMPT, Capabilities, Level, Rule, empty_prompt
from backends.errors import UpstreamProtocolError, error_fields
from schemas.chat_messages import JSONSchemaResponseFormat
from schemas.completions import DEFAULT_MAX_TOKENS, CompletionRequest
from schemas.errors import InvalidRequestError

__all__ = [
    "ECHO_LOGPROBS_RULE",
    "STRUCTURAL_TAG_RULE",
    "TOKEN_PROMPT_RULE",
    "Event",
    "Generation",
    "HasStop",
    "NativeCapabilities",
    "Rule",
    "Sampling",
    "TokenLogprob",
    "answer_head",
    "completion_head",
    "count",
    "empty_prompt_rule",
    "explicit_sampling",
    "finish_of",
    "first_stop",
    "fit_tokens",
    "guided_json_schema",
    "json_constraint",
    "logit_bias_pairs",
    "logprob_tokens",
    "native_seed",
    "no_logprobs",
    "ollama_finish",
    "stops_of",
    "upstream_failed",
    "upstream_max_tokens",
]


# --- capabilities with value rules ------------------------------------------------------


@dataclass(frozen=True)
class NativeCapabilities(Capabilities):
    """A native API's table: only what its translator maps, plus value :class:`Rule`s."""

    @classmethod
    def build(
        cls, levels: Mapping[str, Level], rules: Iterable[Rule] = (), limits: Mapping[str, int] | None = None
    ) -> NativeCapabilities:
        """Unlisted fields are unsupported: a native API does only what its translator maps."""
        base = Capabilities.of(Level.UNSUPPORTED, **levels)
        table = cls(base.levels, base.unsupported).with_rules(rules).with_limits(limits or {})
        return table.with_reasons(
            {
                "stream_options.continuous_usage_stats": _NO_CONTINUOUS_USAGE,
                "prompt_embeds": "the native API takes text (or token ids), not prompt embeddings",
            }
        )


_NO_CONTINUOUS_USAGE = "the native API reports token counts only at the end of a stream"


def _token_prompt(request: CompletionRequest) -> bool:
    prompt = request.prompt
    return not isinstance(prompt, str) and not isinstance(prompt[0], str)


TOKEN_PROMPT_RULE = Rule(
    "prompt", "token-id prompts: the native API takes text only and cannot detokenise for the gateway", _token_prompt
)


def empty_prompt_rule(why: str) -> Rule:
    """Refuse ``prompt: ""`` (or null) by name where the server cannot generate from no text."""
    return Rule("prompt", f"{EMPTY_PROMPT}: {why}", empty_prompt)


ECHO_LOGPROBS_RULE = Rule(
    "echo",
    "echo with logprobs: the native API returns no token logprobs for the prompt",
    lambda r: bool(r.echo) and r.logprobs is not None,
)


# --- what a translator produces ------------------------------------------------------------


@dataclass(slots=True)
class TokenLogprob:
    """One token: its text, logprob, and the most likely alternatives (text -> logprob)."""

    text: str
    logprob: float | None
    top: dict[str, float] | None = None


@dataclass(slots=True)
class Generation:
    """One finished native completion, generated part only, in the upstream's terms."""

    text: str
    tokens: list[TokenLogprob] | None  # None: the upstream returned no token logprobs
    finish: str  # "stop" | "length", already mapped
    usage: TokenUsage
    stop_word: str = ""  # the stop sequence the upstream cut from ``text`` (llama.cpp tells)


@dataclass(slots=True)
class Event:
    """One native stream event; ``finish`` set on the last one (which may carry text too)."""

    text: str
    tokens: list[TokenLogprob] | None = None
    finish: str | None = None
    usage: TokenUsage | None = None
    stop_word: str = ""


def no_logprobs(backend: str) -> UpstreamProtocolError:
    """Text generated without the logprobs the request asked for (either endpoint).

    An upstream that ignores the field (an Ollama without logprobs) would otherwise give an
    empty success; the reference says the sampled token's logprob is always returned.
    """
    return UpstreamProtocolError(
        f"backend '{backend}' answered without the logprobs the request asked for (the server does not support them)",
        param="logprobs",
        backend=backend,
        reason="no_logprobs",
    )


def upstream_failed(backend: str, obj: dict[str, Any]) -> UpstreamProtocolError:
    """A native error event in a stream (either endpoint, every server), as the error the gateway ends
    the stream with; what the server said is redacted and bounded (``backends.error_bodies.error_fields``)."""
    message = error_fields(obj).message
    return UpstreamProtocolError(f"the upstream failed mid-stream: {message}", backend=backend, reason="stream_error")


def finish_of(table: Mapping[str, str], reason: Any, backend: str) -> str:
    """A final event's finish reason (either endpoint) through the server's ``table``; one the table
    does not know (or none) is the upstream's error, never taken for ``stop``."""
    mapped = table.get(reason) if isinstance(reason, str) else None
    if mapped is None:
        raise UpstreamProtocolError(f"the upstream sent an unknown finish_reason {str(reason)[:40]!r}", backend=backend)
    return mapped


# Ollama's done_reason, for both endpoints (ollama.py and ollama_chat.py): here rather than in
# ollama.py, which imports the chat translator, so neither translator depends on the other.
_OLLAMA_FINISH = {"stop": "stop", "length": "length"}


def ollama_finish(obj: dict[str, Any], backend: str) -> str:
    """A final event's ``done_reason`` (either endpoint) as OpenAI's finish reason; ``load``/``unload``
    or ``""`` (the runner went away) are no answer: an error naming them, never a fake ``stop``."""
    reason = obj.get("done_reason")
    if reason is None:  # Ollama before done_reason existed
        return "stop"
    if reason not in _OLLAMA_FINISH:
        what = {"load": "loaded the model", "unload": "unloaded the model"}.get(str(reason), "ended early")
        raise UpstreamProtocolError(
            f"Ollama {what} instead of answering (done_reason {str(reason)[:20]!r})",
            backend=backend,
            reason="no_answer",
        )
    return _OLLAMA_FINISH[reason]


# A token count no server can mean: at or past 2^32 (the gateway bills by these numbers).
_MAX_COUNT = 2**32


def count(value: Any) -> int | None:
    """A token counter as sent (either endpoint), when it is one: an integer in [0, 2^32); None
    otherwise (negative, a float, a string, a bool, or a number past 2^64, which the JSON reader
    turns into a float)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT:
        return value
    return None


# --- request helpers --------------------------------------------------------------------------


class HasStop(Protocol):
    """A completions or chat request: both carry ``stop`` with the same meaning."""

    @property
    def stop(self) -> str | list[str] | None: ...


def stops_of(request: HasStop) -> list[str]:
    """``stop`` as a list (a lone string is one stop sequence)."""
    stop = request.stop
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


class Sampling(Protocol):
    """The sampling fields completions and chat requests share (same names, same meaning)."""

    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def min_p(self) -> float | None: ...
    @property
    def repetition_penalty(self) -> float | None: ...
    @property
    def presence_penalty(self) -> float | None: ...
    @property
    def frequency_penalty(self) -> float | None: ...


def explicit_sampling(request: Sampling) -> dict[str, float | int]:
    """OpenAI's sampling defaults spelled out, under Ollama's and llama.cpp's shared names.

    Both servers sample at temperature 0.8 with top_k 40 (and more) when a value is not
    sent, so every value is sent: the same request must mean the same thing everywhere.
    """
    return {
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "top_k": request.top_k if request.top_k is not None and request.top_k > 0 else 0,
        "min_p": request.min_p or 0.0,
        "repeat_penalty": 1.0 if request.repetition_penalty is None else request.repetition_penalty,
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
    }


def upstream_max_tokens(request: CompletionRequest) -> int:
    """The explicit limit to send: OpenAI's 16 by default; 0 asks for 1 token that is dropped."""
    max_tokens = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
    return max(max_tokens, 1)


def guided_json_schema(request: CompletionRequest) -> dict[str, Any] | bool:
    """``guided_json`` as a JSON Schema value (it may arrive as a JSON string)."""
    value = request.guided_json
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise InvalidRequestError("guided_json is not valid JSON", param="guided_json") from None
    if not isinstance(value, dict | bool):
        raise InvalidRequestError("guided_json must be a JSON Schema object", param="guided_json")
    return value


def json_constraint(request: CompletionRequest) -> dict[str, Any] | bool | None:
    """The JSON Schema a completion must follow (None: none): ``guided_json``, or a JSON
    ``response_format`` (``json_object``, and a ``json_schema`` without a schema: any object).
    The schema allows one of them at a time."""
    if request.guided_json is not None:
        return guided_json_schema(request)
    fmt = request.response_format
    if isinstance(fmt, JSONSchemaResponseFormat):
        return fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"}
    if fmt is not None and fmt.type == "json_object":
        return {"type": "object"}
    return None


STRUCTURAL_TAG_RULE = Rule(
    "response_format",
    "a structural_tag response_format: the native API has no structural tags (json_object and json_schema are "
    "translated)",
    lambda r: r.response_format is not None and r.response_format.type == "structural_tag",
)


def logit_bias_pairs(bias: Mapping[str, float]) -> list[list[int | float]]:
    """``logit_bias`` as ``[[token_id, bias], ...]``: the form every llama.cpp build reads."""
    return [[int(token), value] for token, value in bias.items()]


def native_seed(seed: int) -> int:
    """An OpenAI int64 seed as the 32-bit one llama.cpp-based samplers use, never their -1 (random)."""
    return seed % 0xFFFFFFFF


def logprob_tokens(entries: Any) -> list[TokenLogprob] | None:
    """``[{token, logprob, top_logprobs: [{token, logprob}]}]`` (Ollama's and llama.cpp's shape)."""
    if not isinstance(entries, list):
        return None
    tokens: list[TokenLogprob] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        top = entry.get("top_logprobs")
        alternatives = None
        if isinstance(top, list):
            alternatives = {
                str(t.get("token", "")): float(t["logprob"])
                for t in top
                if isinstance(t, dict) and isinstance(t.get("logprob"), int | float)
            }
        logprob = entry.get("logprob")
        tokens.append(
            TokenLogprob(
                str(entry.get("token", "")), float(logprob) if isinstance(logprob, int | float) else None, alternatives
            )
        )
    return tokens


# --- stop sequences ---------------------------------------------------------------------------


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, int] | None:
    """``(start, end)`` of the stop match that completes first in ``text``, if any."""
    best: tuple[int, int] | None = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or start + len(stop) < best[1]):
            best = (start, start + len(stop))
    return best


def fit_tokens(tokens: list[TokenLogprob], length: int) -> list[TokenLogprob]:
    """The tokens covering the first ``length`` characters; a token cut in two keeps its logprob.

    Also how upstream token lists are fitted to their text: entries past its end (an EOS
    token, the tokens of a stop sequence the upstream cut) are dropped.
    """
    out: list[TokenLogprob] = []
    pos = 0
    for token in tokens:
        if pos >= length:
            break
        end = pos + len(token.text)
        out.append(token if end <= length else replace(token, text=token.text[: length - pos]))
        pos = end
    return out


# --- JSON -----------------------------------------------------------------------------------------


def answer_head(public_model: str, id_prefix: str, object_: str) -> dict[str, Any]:
    """The fields every answer and chunk of one request share: a fresh id, now, the client's model."""
    created = int(time.time())
    return {"id": f"{id_prefix}{uuid.uuid4().hex}", "object": object_, "created": created, "model": public_model}


def completion_head(public_model: str) -> dict[str, Any]:
    """The fields every answer and chunk of one completions request share."""
    return answer_head(public_model, "cmpl-", "text_completion")
