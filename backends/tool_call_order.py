"""Streamed tool calls leave the gateway one after another, the way OpenAI sends them.

A chat stream may carry several tool calls per choice, each delta fragment tagged with its
call's ``index``. Interleaving them (call 0, call 1, call 0, ...) is legal by index, and vLLM's
and llama.cpp's parsers do it; but OpenAI sends each call whole before the next, and clients
are built on that: the official client's ``chat.completions.stream()`` helper (and others made
the same way) closes a call, parsing its arguments, as soon as another index appears, so with
interleaved fragments its final completion is wrong. :class:`SequentialToolCalls` re-emits
every chat stream out of the gateway in OpenAI's order, per choice (``n > 1`` has several):

- the first call seen is relayed live; fragments of any other call are held, merged into one
  fragment per call (``id``/``type``/``name`` from its first fragment, arguments concatenated,
  byte for byte);
- a call is complete when its arguments close as JSON (the depth of ``{``/``[`` outside
  strings returns to zero) or at the choice's ``finish_reason``; then the lowest held call is
  released (its merged fragment, with ``id``/``type``/``name``: its first delta) and goes live;
- at ``finish_reason`` whatever is still held is released, in index order, in one chunk that
  carries the finish reason (the event it came in keeps its other content, finish reason
  moved); a stream that ends without one releases it all before it ends;
- indexes are the client's: 0, 1, 2... in the order the calls leave (an upstream that numbers
  its calls 0 and 2, or 5 and 3, is renumbered; the SDK's helper indexes a list with them);
- a call's ``id``, ``type`` and ``function.name`` leave once, in its first fragment: an upstream
  that repeats them on every fragment (some do) would have clients concatenate them
  (``get_weatherget_weather``). A later ``name`` that differs from what came so far is the
  rest of the name and passes.

Cost: the request path wraps only streams whose request offers ``tools``
(``gateway.flow.endpoints``), so a stream that cannot carry tool calls pays nothing.
Inside, a read without ``"tool_calls"`` while no call is open is passed on after one
``bytes`` search; only events of a stream with calls open are parsed.

Bounds: what is held is bounded by ``limits.max_response_bytes`` (held calls are what a whole
answer would carry; the native backends bound their calls by the same limit), counted over the
stream: each held fragment's JSON size, plus a fixed charge per call index and per choice index
tracked (an upstream that opens 100,000 calls, or streams one call's arguments forever while the
call before never closes, would otherwise grow a buffer without end). Past it the stream fails
with :class:`~backends.errors.UpstreamTooLargeError`, which the client sees as an error event.
A call ``index`` must be an integer (not a bool): a fragment without one cannot be placed
and ends the stream with an error (clients index a list with it).

The wrapped stream's contract (:class:`~backends.base.CompletionStream`) is kept: whole
events, ``finished``/``usage`` copied from the inner stream after each read, ``aclose()`` closes it.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionStream
from backends.errors import UpstreamProtocolError, UpstreamTooLargeError
from backends.exact_json import dumps_exact, loads_keeping_integers

__all__ = ["MAX_HELD_BYTES", "SequentialToolCalls"]

_TOOL_CALLS = b'"tool_calls"'  # JSON structure only: inside generated text the quotes are escaped
_KEEP_FIRST = frozenset({"index", "id", "type"})  # a call's identity, never concatenated
MAX_HELD_BYTES = 64 * 1024 * 1024  # limits.max_response_bytes' default
_EVENT = "a stream event"
_TRACKED = 64  # bytes charged per call or choice index tracked (its entry in a dict or set)


class _Budget:
    """What one stream holds, in bytes, against its cap (the module docstring's Bounds)."""

    __slots__ = ("backend", "limit", "used")

    def __init__(self, limit: int, backend: str) -> None:
        self.limit, self.backend, self.used = limit, backend, 0

    def charge(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise UpstreamTooLargeError(
                f"the upstream stream's held tool calls are larger than {self.limit} bytes "
                "(limits.max_response_bytes): a call streamed while an earlier one never closed",
                backend=self.backend,
            )


class _Arguments:
    """Whether a call's streamed arguments have closed as JSON; fed fragment by fragment."""

    __slots__ = ("depth", "escaped", "in_string", "opened")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.opened = False

    def feed(self, text: str) -> bool:
        """Take the next fragment; True once the arguments are one closed JSON object or array."""
        depth, in_string, escaped = self.depth, self.in_string, self.escaped
        for ch in text:
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{" or ch == "[":
                depth += 1
                self.opened = True
            elif ch == "}" or ch == "]":
                depth -= 1
        self.depth, self.in_string, self.escaped = depth, in_string, escaped
        return self.opened and depth <= 0 and not in_string


def _arguments_of(fragment: dict[str, Any]) -> str:
    function = fragment.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else ""


class _Parts(list[str]):
    """A held string as its fragments, joined once at release (``have + value`` per fragment was
    quadratic: 64 MiB of one held call's arguments cost about a minute of the event loop)."""


def _merge(into: dict[str, Any], fragment: dict[str, Any]) -> None:
    """``fragment`` accumulated into ``into`` as a client would: strings concatenated, objects merged."""
    for key, value in fragment.items():
        have = into.get(key)
        if have is None:
            into[key] = dict(value) if isinstance(value, dict) else value
        elif isinstance(value, dict) and isinstance(have, dict):
            _merge(have, value)
        elif isinstance(value, str) and key not in _KEEP_FIRST:
            if isinstance(have, _Parts):
                have.append(value)
            elif isinstance(have, str):
                into[key] = _Parts((have, value))


def _joined(merged: dict[str, Any]) -> dict[str, Any]:
    """A held call ready to leave: every string held as fragments joined, once."""
    for key, value in merged.items():
        if isinstance(value, _Parts):
            merged[key] = "".join(value)
        elif isinstance(value, dict):
            _joined(value)
    return merged


class _Choice:
    """One choice's calls: the live one, the held ones (merged) and the ones already done."""

    __slots__ = ("arguments", "budget", "done", "held", "live", "names", "numbers", "sizes")

    def __init__(self, budget: _Budget | None = None) -> None:
        budget = budget or _Budget(MAX_HELD_BYTES, "")
        budget.charge(_TRACKED)
        self.budget = budget
        self.sizes: dict[int, int] = {}  # bytes charged per held call, given back when it leaves
        self.live: int | None = None
        self.arguments = _Arguments()
        self.held: dict[int, dict[str, Any]] = {}
        self.done: set[int] = set()
        self.numbers: dict[int, int] = {}  # the upstream's index -> the client's, in the order calls leave
        self.names: dict[int, list[Any]] = {}  # the upstream's index -> [id, type, name so far]

    def _number(self, index: int, fragment: dict[str, Any]) -> dict[str, Any]:
        """``fragment`` as it leaves: with the client's index (the same object when that is its own)."""
        number = self.numbers.get(index)
        if number is None:
            number = self.numbers[index] = len(self.numbers)
        return fragment if number == index else {**fragment, "index": number}

    def _once(self, index: int, fragment: dict[str, Any]) -> dict[str, Any]:
        """``fragment`` without the ``id``/``type``/``name`` its call already carried (a new object if any)."""
        function = fragment.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        seen = self.names.get(index)
        if seen is None:
            self.names[index] = [fragment.get("id"), fragment.get("type"), name]
            return fragment
        drop = []
        for slot, key in enumerate(("id", "type")):
            if key in fragment:
                if seen[slot] is None:
                    seen[slot] = fragment[key]  # the first fragment that carries it
                else:
                    drop.append(key)
        repeated = isinstance(name, str) and name == seen[2]
        if isinstance(name, str) and not repeated:
            seen[2] = name if seen[2] is None else seen[2] + name  # the rest of a streamed name
        if not drop and not repeated:
            return fragment
        out = {key: value for key, value in fragment.items() if key not in drop}
        if repeated:
            assert isinstance(function, dict)
            out["function"] = {key: value for key, value in function.items() if key != "name"}
        return out

    def take(self, fragments: list[Any]) -> list[Any]:
        """The fragments to relay now, in order; the others are held."""
        out: list[Any] = []
        for fragment in fragments:
            index = fragment.get("index") if isinstance(fragment, dict) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise UpstreamProtocolError(
                    "the upstream sent a tool call fragment without an integer index", backend=self.budget.backend
                )
            assert isinstance(fragment, dict)
            fragment = self._once(index, fragment)
            if self.live is None and index not in self.done:
                self.budget.charge(_TRACKED)  # it joins ``done`` when it closes
                self.live, self.arguments = index, _Arguments()
            if index == self.live:
                out.append(self._number(index, fragment))
                if self.arguments.feed(_arguments_of(fragment)):
                    self._advance(out)
            elif index in self.done:
                out.append(self._number(index, fragment))  # late bytes of a closed call (trailing space): never dropped
            else:
                size = len(dumps_exact(fragment, self.budget.backend)) + (0 if index in self.held else _TRACKED)
                self.budget.charge(size)  # before it is held: over the cap, nothing more is kept
                self.sizes[index] = self.sizes.get(index, 0) + size
                held = self.held.get(index)
                if held is None:
                    self.held[index] = _copy(fragment)
                else:
                    _merge(held, fragment)
        return out

    def _advance(self, out: list[Any]) -> None:
        """The live call is complete: release the lowest held call, which goes live (and so on)."""
        while True:
            assert self.live is not None
            self.done.add(self.live)
            self.live = None
            if not self.held:
                return
            index = min(self.held)
            merged = _joined(self.held.pop(index))
            self.budget.used -= self.sizes.pop(index, 0) - _TRACKED  # it stays tracked, in ``done`` later
            out.append(self._number(index, merged))
            self.live, self.arguments = index, _Arguments()
            if not self.arguments.feed(_arguments_of(merged)):
                return

    def release(self) -> list[dict[str, Any]]:
        """Every held call, merged, in index order (the choice is finishing: its charge is given back)."""
        self.budget.used -= sum(self.sizes.values()) + _TRACKED * (len(self.done) + (self.live is not None) + 1)
        self.sizes.clear()
        return [self._number(index, _joined(self.held[index])) for index in sorted(self.held)]


def _copy(fragment: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    _merge(merged, fragment)
    return merged


class SequentialToolCalls(CompletionStream):
    """A chat stream with each choice's tool calls re-emitted one after another (module docstring)."""

    def __init__(self, inner: CompletionStream, *, max_held: int = MAX_HELD_BYTES, backend: str = "") -> None:
        self._inner = inner
        self._budget = _Budget(max_held, backend)
        self._choices: dict[Any, _Choice] = {}  # by choice index, while it has calls and no finish yet
        self._envelope: dict[str, Any] | None = None  # the last parsed chunk, for a release at the end
        self._ended = False

    async def __anext__(self) -> bytes:
        while True:
            inner = self._inner
            try:
                block = await inner.__anext__()
            except StopAsyncIteration:
                self.finished, self.usage = inner.finished, inner.usage
                tail = self._release_all()
                if tail:
                    return tail
                raise
            except BaseException:
                self.finished, self.usage = inner.finished, inner.usage
                raise
            self.finished, self.usage = inner.finished, inner.usage  # read by the consumer after each block
            if not self._choices and _TOOL_CALLS not in block:
                return block  # no call open and none starting: as it came
            out = self._reorder(block)
            if inner.finished:
                out += self._release_all()  # the consumer sends this block last
            if out:
                return out

    async def aclose(self) -> None:
        await self._inner.aclose()
        self.finished, self.usage = self._inner.finished, self._inner.usage

    def _reorder(self, block: bytes) -> bytes:
        out: list[bytes] = []
        for event in block.split(b"\n\n"):
            if not event:
                continue
            if not self._choices and _TOOL_CALLS not in event:
                out.append(event + b"\n\n")
                continue
            try:  # integers kept exact: a call index past 64 bits is an index (renumbered), not a float
                obj = loads_keeping_integers(event[5:] if event.startswith(b"data:") else event, self._budget.backend)
            except orjson.JSONDecodeError:
                obj = None
            choices = obj.get("choices") if isinstance(obj, dict) else None
            if not isinstance(choices, list) or not choices:
                out.append(event + b"\n\n")  # a usage chunk, or nothing this class reorders
                continue
            out.extend(self._event(obj, choices, event))
        return b"".join(out)

    def _event(self, obj: dict[str, Any], choices: list[Any], raw: bytes) -> list[bytes]:
        """One chunk: its call fragments placed, then (after it) a release for each choice finishing."""
        self._envelope = obj
        changed = False
        after: list[bytes] = []
        kept: list[Any] = []
        for choice in choices:
            if not isinstance(choice, dict):
                kept.append(choice)
                continue
            index = choice.get("index")
            delta = choice.get("delta")
            fragments = delta.get("tool_calls") if isinstance(delta, dict) else None
            state = self._choices.get(index)
            if isinstance(fragments, list) and fragments:
                if state is None:
                    state = self._choices[index] = _Choice(self._budget)
                now = state.take(fragments)
                if len(now) != len(fragments) or any(a is not b for a, b in zip(now, fragments, strict=True)):
                    changed = True
                    assert isinstance(delta, dict)
                    if now:
                        delta["tool_calls"] = now
                    else:
                        del delta["tool_calls"]
            finish = choice.get("finish_reason")
            if finish is not None and state is not None:
                del self._choices[index]
                held = state.release()
                if held:
                    changed = True
                    choice["finish_reason"] = None
                    after.append(self._chunk(index, held, finish))
            if changed and _empty(choice):
                continue  # all it carried was held: nothing left to say
            kept.append(choice)
        if not changed:
            return [raw + b"\n\n"]
        if not kept and not obj.get("usage"):
            return after
        return [b"data: " + dumps_exact({**obj, "choices": kept}, self._budget.backend, _EVENT) + b"\n\n", *after]

    def _chunk(self, index: Any, calls: list[dict[str, Any]], finish: Any) -> bytes:
        """A chunk releasing ``calls`` of choice ``index`` (with its finish reason, if any)."""
        envelope = self._envelope or {}
        choice = {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": finish}
        chunk = {key: value for key, value in envelope.items() if key != "usage"}
        chunk["choices"] = [choice]
        if "usage" in envelope:
            chunk["usage"] = None
        return b"data: " + dumps_exact(chunk, self._budget.backend, _EVENT) + b"\n\n"

    def _release_all(self) -> bytes:
        """What is still held when the stream ends without a finish reason: released, never dropped."""
        if self._ended:
            return b""
        self._ended = True
        out = [self._chunk(index, held, None) for index, state in self._choices.items() if (held := state.release())]
        self._choices.clear()
        return b"".join(out)


def _empty(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    return choice.get("finish_reason") is None and choice.get("logprobs") is None and not delta
