"""The optional audit log: one JSON line per request on a completion endpoint (``server.audit_log: true``).

Each line carries the request id, the key's configured *name* (never its secret), the model,
the backend, the final status (a stream that failed after its first event says the error's
status, as the metrics do), token counts from the upstream's usage and the latency::

    {"event":"completion","time":1700000000.123,"request_id":"req-...","key":"team-a",
     "model":"gpt-x","backend":"openai-main","status":200,"prompt_tokens":12,
     "completion_tokens":30,"latency_ms":412.7,"endpoint":"completions","user":"user-1234",
     "cached_tokens":0,"cost":0.0000315}

``cost`` is what the request cost at its route's ``pricing`` (``gateway.spend``), in the prices'
currency, exact to the usage charged (the upstream's, or the gateway's estimate when it reported
none); null when the route has no price or nothing was charged. ``cached_tokens`` is the part of
``prompt_tokens`` the upstream read from its prompt cache.

``endpoint`` is ``completions`` or ``chat``; ``event`` stays ``completion`` for both. With tracing
on (``telemetry``), ``trace_id`` and ``span_id`` name the request's server span, sampled or not.

``user`` is the request's ``user`` field (OpenAI's end-user id for abuse monitoring; null when
unset). The gateway honours it here on every backend, the ones whose server has no such field
included. It is client-supplied text: cut to :data:`USER_MAX` characters and its control
characters (C0, DEL, C1, U+2028/U+2029) written as ``\\uXXXX`` text, so a line viewed raw or
pasted into a terminal shows what was sent and nothing else. It never becomes a metric label.

Lines go to the ``gateway.security.audit`` logger. When nothing has configured that logger, it gets
a handler of its own writing bare JSON lines to stderr (not the text format of the other
logs) and does not propagate, so a log shipper can parse every line as JSON. Nothing is
formatted when the audit log is off: the hook that calls :meth:`AuditLog.write` is then not
installed at all.
"""

from __future__ import annotations

import logging
import re
import sys
import time

import orjson

__all__ = ["USER_MAX", "AuditLog", "audit_user"]

LOGGER = "gateway.audit"
USER_MAX = 256  # characters of ``user`` kept: OpenAI's ids are short; the line stays bounded
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def audit_user(user: str | None) -> str | None:
    """``user`` as the audit line carries it: at most :data:`USER_MAX` characters, control characters escaped."""
    if user is None:
        return None
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", user[:USER_MAX])


class AuditLog:
    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger if logger is not None else logging.getLogger(LOGGER)
        if not self._log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(message)s"))
            self._log.addHandler(handler)
            self._log.propagate = False
        if self._log.level == logging.NOTSET:
            self._log.setLevel(logging.INFO)

    def write(
        self,
        *,
        request_id: str,
        key: str | None,
        model: str | None,
        backend: str | None,
        status: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        latency: float,
        endpoint: str = "completions",
        user: str | None = None,
        trace: tuple[str, str] | None = None,
        cost: int | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """One line; ``trace``: the request's ``(trace_id, span_id)`` when tracing is on (hex, as W3C writes them);
        ``cost`` in units of 10^-12 of the currency (``gateway.spend.prices.UNIT``)."""
        fields = {
            "event": "completion",
            "time": round(time.time(), 3),
            "request_id": request_id,
            "key": key,
            "model": model,
            "backend": backend,
            "status": status,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "latency_ms": round(latency * 1000, 1),
            "endpoint": endpoint,
            "user": audit_user(user),
            "cached_tokens": cached_tokens,
            # int / int is correctly rounded, and orjson writes a float's shortest repr: the exact decimal.
            "cost": cost / 10**12 if cost is not None else None,
        }
        if trace is not None:
            fields["trace_id"], fields["span_id"] = trace
        self._log.info(orjson.dumps(fields).decode())
