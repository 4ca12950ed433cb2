"""The OpenAI ``text_completion`` choice built from a native translator's output; no I/O.

What a native translator produces (:class:`~backends.native.common.Generation`, a series of
:class:`~backends.native.common.Event`) becomes an OpenAI choice here, the same way for
every native API:

- ``echo`` by prepending the prompt, stop sequences cut where the upstream leaves them in
  the output (:class:`StopCutter`), ``include_stop_str_in_output``, ``max_tokens: 0``
  (one token asked for, dropped);
- logprobs in OpenAI's legacy arrays, ``text_offset`` computed here from the token texts
  (absolute in the choice's text, echoed prompt included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.native.common import Generation, TokenLogprob, first_stop, fit_tokens, no_logprobs, stops_of
from schemas.completions import CompletionRequest

__all__ = ["ChoiceTracker", "StopCutter", "build_choice", "legacy_logprobs"]


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
            raise no_logprobs(self._backend)
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
