"""W3C Trace Context (``traceparent``, ``tracestate``) and the sampling decision, without OpenTelemetry.

The gateway decides whether a request is recorded before any OpenTelemetry call, here: an
unsampled request then costs a header parse and two random numbers, and still propagates
its context (``traceparent`` with the sampled flag off) to every upstream attempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from random import getrandbits

__all__ = ["Parent", "Sampler", "new_span_id", "new_trace_id", "parse_traceparent", "traceparent"]

# version-traceid-parentid-flags; a future version may append fields after a dash (the spec says
# to parse what it knows of it), version ff is invalid, ids of all zeros are invalid.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# One tracestate list member: a key (simple or tenant@system) = a value of printable ASCII but ',' and '='.
_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_LOW64 = (1 << 64) - 1
MAX_TRACESTATE = 512  # characters passed on; the spec allows 32 list members, vendors keep them short


@dataclass(frozen=True, slots=True)
class Parent:
    """A caller's span context, from its ``traceparent``."""

    trace_id: int
    span_id: int
    sampled: bool
    tracestate: str | None = None


def parse_traceparent(value: str | None, tracestate: str | None = None) -> Parent | None:
    """The caller's context, or None for a missing or malformed header (the request then starts a trace)."""
    if not value:
        return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_hex, span_hex, flags = m.group(1, 2, 3, 4)
    if version == "ff" or (version == "00" and m.group(5) is not None):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(flags, 16) & 1), _tracestate(tracestate))


def _tracestate(value: str | None) -> str | None:
    """The caller's ``tracestate`` when it is valid and at most :data:`MAX_TRACESTATE` characters, else None:
    passed on upstream as received, dropped whole rather than cut or repaired."""
    if not value or len(value) > MAX_TRACESTATE:
        return None
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]  # empty members are allowed and mean nothing
    if not members or len(members) > 32 or not all(_MEMBER.fullmatch(m) for m in members):
        return None
    return ",".join(members)


def new_trace_id() -> int:
    return getrandbits(128) or 1  # zero is invalid (one chance in 2**128)


def new_span_id() -> int:
    return getrandbits(64) or 1


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


class Sampler:
    """OpenTelemetry's ``TraceIdRatioBased`` (the low 64 bits of the trace id under a bound), parent-based or not.

    Deterministic per trace id, so every service sampling the same trace at the same ratio agrees.
    """

    __slots__ = ("_bound", "parent_based", "ratio")

    def __init__(self, ratio: float, *, parent_based: bool) -> None:
        self.ratio = ratio
        self.parent_based = parent_based
        self._bound = round(ratio * (_LOW64 + 1))

    def sampled(self, parent: Parent | None) -> tuple[bool, int]:
        """(record this request?, its trace id: the parent's, or a new one)."""
        if parent is not None:
            if self.parent_based:
                return parent.sampled, parent.trace_id
            return (parent.trace_id & _LOW64) < self._bound, parent.trace_id
        trace_id = getrandbits(128) or 1  # as new_trace_id(), without the call
        return (trace_id & _LOW64) < self._bound, trace_id
