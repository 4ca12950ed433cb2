"""Pieces shared by the native-API translators (``tgi``, ``ollama``, ``llamacpp``); no I/O.

A native API answers one prompt with one completion, in its own shape. A translator
turns that into a :class:`Generation` (non-streaming) or a series of :class:`Event`
(streaming); everything after that is the same for every native API and lives here:

- the OpenAI ``text_completion`` choice: ``echo`` by prepending the prompt, stop
  sequences cut where the upstream leaves them in the output (:class:`StopCutter`),
  ``include_stop_str_in_output``, ``max_tokens: 0`` (one token asked for, dropped);
- logprobs in OpenAI's legacy arrays, ``text_offset`` computed here from the token
  texts (absolute in the choice's text, echoed prompt included);
- ids, ``created``, chunk and usage JSON;
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
from backends.errors import UpstreamProtocolError
from schemas.completions import DEFAULT_MAX_TOKENS, CompletionRequest
from schemas.errors import InvalidRequestError

__all__ = [
    "ECHO_LOGPROBS_RULE",
    "TOKEN_PROMPT_RULE",
    "ChoiceTracker",
    "Event",
    "Generation",
    "NativeCapabilities",
    "Rule",
    "Sampling",
    "StopCutter",
    "TokenLogprob",
    "answer_head",
    "build_choice",
    "completion_head",
    "empty_prompt_rule",
    "explicit_sampling",
    "first_stop",
    "fit_tokens",
    "guided_json_schema",
    "logprob_tokens",
    "native_seed",
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
        return table.with_reasons({"stream_options.continuous_usage_stats": _NO_CONTINUOUS_USAGE})


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


def upstream_failed(backend: str, message: str) -> UpstreamProtocolError:
    """A native error event in a stream (either endpoint), as the error the gateway ends the stream with."""
    return UpstreamProtocolError(f"the upstream failed mid-stream: {message}", backend=backend, reason="stream_error")


# --- request helpers --------------------------------------------------------------------------


def stops_of(request: CompletionRequest) -> list[str]:
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


class StopCutter:
    """Cuts generated text at the first stop sequence, for upstreams that leave it in (TGI).

    Fed piece by piece (a stream) or at once; text that could be the start of a stop
    sequence is held back until the next piece decides. With ``keep`` the stop sequence
    itself stays (``include_stop_str_in_output``). Token lists, when given, are kept
    aligned with the text: whole tokens are held back, and the token a stop starts in is
    shortened, as OpenAI's answers do.
    """

    __slots__ = ("_held", "_stops", "_tokens", "keep", "stopped")

    def __init__(self, stops: Sequence[str], keep: bool) -> None:
        self._stops = tuple(stops)
        self.keep = keep
        self._held = ""
        self._tokens: list[TokenLogprob] = []
        self.stopped = False

    def feed(self, text: str, tokens: list[TokenLogprob] | None) -> tuple[str, list[TokenLogprob] | None]:
        if self.stopped:
            return "", [] if tokens is not None else None
        held = self._held + text
        if tokens is not None:
            self._tokens.extend(tokens)
        match = first_stop(held, self._stops)
        if match is not None:
            self.stopped = True
            cut = match[1] if self.keep else match[0]
            cut_tokens = fit_tokens(self._tokens, cut) if tokens is not None else None
            self._held, self._tokens = "", []
            return held[:cut], cut_tokens
        safe = len(held) - self._partial(held)
        out_tokens: list[TokenLogprob] | None = None
        if tokens is not None:
            pos, count = 0, 0
            for token in self._tokens:  # release whole tokens only
                if pos + len(token.text) > safe:
                    break
                pos += len(token.text)
                count += 1
            safe = pos
            out_tokens, self._tokens = self._tokens[:count], self._tokens[count:]
        self._held = held[safe:]
        return held[:safe], out_tokens

    def flush(self) -> tuple[str, list[TokenLogprob] | None]:
        """What was held back, once the upstream has finished without completing a stop."""
        text, tokens = self._held, self._tokens
        self._held, self._tokens = "", []
        return text, tokens

    def _partial(self, text: str) -> int:
        """Length of the longest end of ``text`` that begins some stop sequence."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest


# --- logprobs --------------------------------------------------------------------------------


def _top_entry(token: TokenLogprob, k: int) -> dict[str, float] | None:
    """At most ``k`` alternatives plus the chosen token (OpenAI: up to ``logprobs + 1`` entries)."""
    if token.logprob is None:
        return None
    top: dict[str, float] = {}
    if k and token.top:
        for text, logprob in sorted(token.top.items(), key=lambda item: item[1], reverse=True)[:k]:
            top[text] = logprob
    top.setdefault(token.text, token.logprob)
    return top


def legacy_logprobs(tokens: Sequence[TokenLogprob], start: int, k: int) -> dict[str, Any]:
    """OpenAI's legacy arrays; ``start`` is where the first token sits in the choice's text."""
    offsets: list[int] = []
    pos = start
    for token in tokens:
        offsets.append(pos)
        pos += len(token.text)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [_top_entry(t, k) for t in tokens],
        "text_offset": offsets,
    }


# --- one choice ---------------------------------------------------------------------------------


class ChoiceTracker:
    """Turns one native completion into OpenAI choice dicts (without ``index``), piece by piece.

    Contract: ``piece()`` for each event's text and tokens, then ``last()`` once with the
    finish reason. ``strips_stop`` says whether the upstream already removed stop
    sequences (Ollama, llama.cpp) or leaves them in (TGI). Offsets are absolute in the
    choice's text (echoed prompt included); choices carry ``logprobs: null`` unless asked.
    """

    __slots__ = ("_backend", "_cutter", "_drop", "_echo", "_include_stop", "_k", "_offset", "_want_logprobs")

    def __init__(self, request: CompletionRequest, echo_text: str, *, strips_stop: bool, backend: str = "") -> None:
        self._backend = backend
        stops = stops_of(request)
        self._include_stop = bool(request.include_stop_str_in_output)
        self._cutter = StopCutter(stops, self._include_stop) if stops and not strips_stop else None
        self._want_logprobs = request.logprobs is not None
        self._k = request.logprobs or 0
        self._echo = echo_text if request.echo else ""
        self._offset = 0
        self._drop = request.max_tokens == 0  # the one token asked for is not the client's

    def _choice(self, text: str, tokens: list[TokenLogprob] | None, finish: str | None) -> dict[str, Any]:
        prefix, self._echo = self._echo, ""
        start = self._offset + len(prefix)  # where this piece's generated text begins
        self._offset = start + len(text)
        if self._want_logprobs and tokens is None and text:
            # An upstream that ignores the field (an Ollama without logprobs) would give an empty
            # success; the reference says the sampled token's logprob is always returned.
            raise UpstreamProtocolError(
                f"backend '{self._backend}' answered without the logprobs the request asked for "
                "(the server does not support them)",
                param="logprobs",
                backend=self._backend,
                reason="no_logprobs",
            )
        logprobs = legacy_logprobs(tokens or [], start, self._k) if self._want_logprobs else None
        return {"text": prefix + text, "logprobs": logprobs, "finish_reason": finish}

    def piece(self, text: str, tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """The choice delta for one event, or None when it has nothing to show yet."""
        if self._drop:
            return None
        if self._cutter is not None:
            text, tokens = self._cutter.feed(text, tokens)
        if not text and not tokens and not self._echo:
            return None
        return self._choice(text, tokens, None)

    def last(self, text: str, tokens: list[TokenLogprob] | None, finish: str, stop_word: str) -> dict[str, Any]:
        """The final choice delta: the last text, anything held back, and the finish reason."""
        if self._drop:
            return self._choice("", [] if tokens is not None else None, "length")
        cutter = self._cutter
        if cutter is not None:
            text, tokens = cutter.feed(text, tokens)
            if cutter.stopped:
                finish = "stop"
            else:
                rest, rest_tokens = cutter.flush()
                text += rest
                if tokens is not None and rest_tokens is not None:
                    tokens = [*tokens, *rest_tokens]
        elif self._include_stop and finish == "stop" and stop_word:
            text += stop_word  # the upstream cut it and said which it was (no token logprobs for it)
        return self._choice(text, tokens, finish)

    @property
    def dropped(self) -> bool:
        """Whether the generated tokens are not the client's (``max_tokens: 0``)."""
        return self._drop


def build_choice(
    request: CompletionRequest, gen: Generation, echo_text: str, *, strips_stop: bool, backend: str = ""
) -> dict[str, Any]:
    """A whole non-streaming choice (without ``index``) from one :class:`Generation`.

    Raises ``UpstreamProtocolError`` (``param: logprobs``) when logprobs were asked for and
    the upstream generated text without them.
    """
    tracker = ChoiceTracker(request, echo_text, strips_stop=strips_stop, backend=backend)
    return tracker.last(gen.text, gen.tokens, gen.finish, gen.stop_word)


# --- JSON -----------------------------------------------------------------------------------------


def answer_head(public_model: str, id_prefix: str, object_: str) -> dict[str, Any]:
    """The fields every answer and chunk of one request share: a fresh id, now, the client's model."""
    created = int(time.time())
    return {"id": f"{id_prefix}{uuid.uuid4().hex}", "object": object_, "created": created, "model": public_model}


def completion_head(public_model: str) -> dict[str, Any]:
    """The fields every answer and chunk of one completions request share."""
    return answer_head(public_model, "cmpl-", "text_completion")
