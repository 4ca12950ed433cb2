"""Access-log lines that name the request's trace: `` trace_id=<32 hex> span_id=<16 hex>`` after aiohttp's line.

Used instead of aiohttp's own access logger only while tracing is on (``gateway.shutdown.serve``);
the line is otherwise aiohttp's, format and all. A request that never reached a completion
handler (``/metrics``, a malformed request) has no trace and no suffix.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_log import AccessLogger

from gateway.tracing.spans import TRACE_KEY

__all__ = ["TracedAccessLogger"]


class _Suffixed(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Appends the owner's current suffix to each message (one access line at a time: the loop's thread)."""

    def __init__(self, logger: logging.Logger, owner: TracedAccessLogger) -> None:
        super().__init__(logger, {})
        self._owner = owner

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{msg}{self._owner.suffix}", kwargs


class TracedAccessLogger(AbstractAccessLogger):
    """aiohttp's access line, plus the request's ``trace_id`` and ``span_id`` when it has a trace."""

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self.suffix = ""
        self._line = AccessLogger(_Suffixed(logger, self), log_format)  # type: ignore[arg-type]

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        trace = request.get(TRACE_KEY)
        if trace is not None:
            trace_id, span_id = trace.ids
            self.suffix = f" trace_id={trace_id} span_id={span_id}"
        else:
            self.suffix = ""
        self._line.log(request, response, time)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
