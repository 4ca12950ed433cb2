"""Serving until SIGTERM/SIGINT, then draining: what ``gateway serve`` runs.

On the signal:

1. ``/health`` answers 503 ``draining`` at once, and every answer from then on carries
   ``Connection: close``, so a client that has just sent its next request on a keep-alive
   connection gets it answered and then reconnects elsewhere; for ``server.drain_delay``
   seconds the gateway keeps accepting, so a load balancer sees it leave before connections
   are refused;
2. it stops listening; a keep-alive connection is closed under its client only once it has
   been idle for a short grace (``_IDLE_GRACE``, at most the drain timeout) since its last
   answer: closing an idle connection at once loses a request already on the wire;
3. in-flight completions and streams get up to ``server.drain_timeout`` seconds to finish
   (the drain ends sooner once no connection is left);
4. those still running are cancelled: a stream ends with an SSE error event
   (``gateway_shutting_down``) and ``data: [DONE]``, a request still waiting gets a 503,
   never a bare cut;
5. the app's cleanup closes probes and upstream clients.

aiohttp's own ``run_app`` shutdown waits up to twice its timeout and cancels handlers
while closing their connections, so a stream could not say why it ended; hence this module.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

from aiohttp import web

from gateway.http.protocol import FrontDoorRunner
from gateway.state import STATE, InFlight

__all__ = ["serve"]

log = logging.getLogger("gateway")

# Seconds a keep-alive connection may sit idle during a drain before it is closed under its client:
# a busy client sends its next request within milliseconds of an answer and gets "Connection:
# close" on it; one idle longer is treated as gone.
_IDLE_GRACE = 2.0
_TICK = 0.05


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    drain_timeout: float,
    sock: socket.socket | None = None,
    drain_delay: float = 0.0,
    access_log: logging.Logger | None = None,
) -> None:
    """Serve the gateway ``app`` until SIGTERM or SIGINT, then drain as the module docstring says.

    ``sock``: an already listening socket to accept on instead of binding ``host``:``port`` (a
    worker of ``gateway serve --workers N`` shares the control process's socket); stopping
    closes this process's copy only.
    """
    state = app[STATE]
    in_flight = state.in_flight
    extra: dict[str, Any] = {}
    if access_log is not None and state.tracing is not None:  # lines name their trace (gateway.tracing)
        from gateway.tracing.access_log import TracedAccessLogger

        extra["access_log_class"] = TracedAccessLogger
        state.tracing.keyed = True  # each request keeps its trace for the line
    runner = FrontDoorRunner(  # malformed HTTP answered in our envelope; Connection: close while draining
        app, handle_signals=False, handler_cancellation=True, access_log=access_log, shutdown_timeout=1.0, **extra
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    try:
        site: web.BaseSite = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
        await site.start()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        state.draining = True  # /health answers 503 from now on
        runner.start_draining()  # every answer closes its connection
        drain_deadline = loop.time() + drain_delay + drain_timeout
        log.info(
            "shutting down: %d request(s) in flight; draining for up to %.0fs (after a %.0fs delay)",
            len(in_flight),
            drain_timeout,
            drain_delay,
        )
        grace = min(_IDLE_GRACE, drain_timeout)
        if drain_delay > 0:
            await _settle(runner, in_flight, loop.time() + drain_delay, grace, until_quiet=False)
        await site.stop()  # no new connections
        if not await _settle(runner, in_flight, drain_deadline, grace, until_quiet=True):
            log.warning("drain timeout: ending %d request(s) still in flight", len(in_flight))
            await in_flight.cancel_all()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await runner.cleanup()  # on_shutdown, then cleanup_ctx: probes, upstream clients


async def _settle(
    runner: FrontDoorRunner, in_flight: InFlight, until: float, grace: float, *, until_quiet: bool
) -> bool:
    """Close connections idle for ``grace`` until the loop time ``until`` (or, with ``until_quiet``,
    until nothing is in flight and no connection is open). True when nothing is in flight at the end."""
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        runner.close_idle(grace)
        if until_quiet and not len(in_flight) and not runner.open_connections():
            return True
        await asyncio.sleep(min(_TICK, max(0.0, until - loop.time())))
    return not len(in_flight)
