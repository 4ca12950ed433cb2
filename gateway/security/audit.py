"""The optional audit log: one JSON line per request on a completion endpoint (``server.audit_log: true``).

Each line carries the request id, the key's configured *name* (never its secret), the model,
the backend, the final status (a stream that failed after its first event says the error's
status, as the metrics do), token counts from the upstream's usage and the latency::

    {"event":"completion","time":1700000000.123,"request_id":"req-...","key":"team-a",
     "model":"gpt-x","backend":"openai-main","status":200,"prompt_tokens":12,
     "completion_tokens":30,"latency_ms":412.7,"endpoint":"completions"}

``endpoint`` is ``completions`` or ``chat``; ``event`` stays ``completion`` for both.

Lines go to the ``gateway.security.audit`` logger. When nothing has configured that logger, it gets
a handler of its own writing bare JSON lines to stderr (not the text format of the other
logs) and does not propagate, so a log shipper can parse every line as JSON. Nothing is
formatted when the audit log is off: the hook that calls :meth:`AuditLog.write` is then not
installed at all.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

__all__ = ["AuditLog"]

LOGGER = "gateway.audit"


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
    ) -> None:
        line = orjson.dumps(
            {
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
            }
        )
        self._log.info(line.decode())
